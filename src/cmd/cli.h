// The vfio-dra-plugin command line (serve, discover, slices, version). A bad flag or value is one
// line on stderr naming it, and exit code 2. Shared by the daemon's main and the test daemon,
// which runs the same command against a simulated kernel.
#pragma once

#include "cmd/serve_command.h"

namespace vfio_dra::cmd {

int RunCli(int argc, char** argv, const ServeEnvironment& environment);

}  // namespace vfio_dra::cmd
