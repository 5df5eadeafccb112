// vfio-dra-sim-daemon: the real vfio-dra-plugin command line, with the kernel replaced by the
// SimulatedKernel over --sysfs-root/--dev-root. Used by tests that drive the daemon as a process
// (through the kubelet simulator) and by the prepare benchmark. Test-only knobs, from the
// environment:
//   VFIO_DRA_SIM_CRASH_AT_STEP=N  SIGKILL itself just before the N-th prepare/unprepare step
//   VFIO_DRA_SIM_STEP_LOG=FILE    append every step name to FILE
//   VFIO_DRA_SIM_WRITE_LOG=FILE   append every sysfs write (JSON lines) to FILE
//   VFIO_DRA_SIM_HANG_UNBIND=BDF  unbinds of that function block (until the process exits)
//   VFIO_DRA_SIM_DENY_WRITES=PATH:ERRNO[,PATH:ERRNO...]
//                                 writes to those sysfs paths (relative to the root; empty: all)
//                                 fail with that errno number (SimulatedKernel::DenyWrites)
//   VFIO_DRA_SIM_PROCESS_STATUS=FILE  read the effective capabilities from FILE, not
//                                 /proc/self/status
//   VFIO_DRA_TEST_PAUSE_AT=STEP[,STEP...] with VFIO_DRA_TEST_PAUSE_DIR=DIR
//                                 pause at those steps until the test resumes (step_pause.h)
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "cmd/cli.h"
#include "simulated_kernel.h"
#include "step_pause.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

int main(int argc, char** argv) {
  using vfio_dra::cmd::ServeEnvironment;
  using vfio_dra::cmd::ServeOptions;
  ServeEnvironment environment;
  // The kernel the daemon writes to, for the crash hook (set once, before any step runs).
  auto kernel_of_daemon = std::make_shared<std::atomic<vfio_dra::testing::SimulatedKernel*>>();
  environment.make_sysfs_writer = [kernel_of_daemon](const ServeOptions& options) {
    auto kernel =
        std::make_unique<vfio_dra::testing::SimulatedKernel>(options.sysfs_root, options.dev_root);
    *kernel_of_daemon = kernel.get();
    if (const std::string log = Env("VFIO_DRA_SIM_WRITE_LOG"); !log.empty()) {
      kernel->LogWritesTo(log);
    }
    if (const std::string hang = Env("VFIO_DRA_SIM_HANG_UNBIND"); !hang.empty()) {
      kernel->HangUnbind(hang);
    }
    std::stringstream denials(Env("VFIO_DRA_SIM_DENY_WRITES"));
    for (std::string denial; std::getline(denials, denial, ',');) {
      const size_t colon = denial.rfind(':');
      if (colon == std::string::npos) continue;
      kernel->DenyWrites(denial.substr(0, colon), std::stoi(denial.substr(colon + 1)));
    }
    return std::unique_ptr<vfio_dra::sysfs::SysfsWriter>(std::move(kernel));
  };
  if (const std::string status = Env("VFIO_DRA_SIM_PROCESS_STATUS"); !status.empty()) {
    environment.process_status = status;
  }
  const std::string crash_at = Env("VFIO_DRA_SIM_CRASH_AT_STEP");
  const std::string step_log = Env("VFIO_DRA_SIM_STEP_LOG");
  auto pause = vfio_dra::testing::StepPauseFromEnvironment();
  const long target = crash_at.empty() ? 0 : std::stol(crash_at);
  auto count = std::make_shared<std::atomic<long>>(0);
  environment.before_prepare_step = [target, step_log, count, kernel_of_daemon,
                                     pause](const std::string& step) {
    pause(step);
    const long n = ++*count;
    if (!step_log.empty()) {
      std::ofstream out(step_log, std::ios::app);
      out << step << "\n";
    }
    if (n != target) return;
    // Another claim's thread may be in a sysfs write right now: the kernel would finish it.
    if (vfio_dra::testing::SimulatedKernel* kernel = *kernel_of_daemon) {
      kernel->KillProcessBetweenWrites();
    }
    ::raise(SIGKILL);
  };
  return vfio_dra::cmd::RunCli(argc, argv, environment);
}
