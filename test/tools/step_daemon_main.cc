// vfio-dra-step-daemon: the real vfio-dra-plugin command line, on the real kernel, with a hook
// that pauses at named prepare/unprepare/recovery steps until the test resumes it
// (step_pause.h). The QEMU node's tests use it to force an interleaving of two instances:
//   VFIO_DRA_TEST_PAUSE_AT=STEP[,STEP...] with VFIO_DRA_TEST_PAUSE_DIR=DIR
// Without them it is the plugin as shipped.
#include "cmd/cli.h"
#include "step_pause.h"

int main(int argc, char** argv) {
  vfio_dra::cmd::ServeEnvironment environment;
  environment.before_prepare_step = vfio_dra::testing::StepPauseFromEnvironment();
  return vfio_dra::cmd::RunCli(argc, argv, environment);
}
