// RunServe: the daemon's life: build and start a ServeDaemon, run until SIGTERM/SIGINT, then stop
// it (the sockets are removed; ResourceSlices are left in place).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cmd/serve_options.h"
#include "sysfs/sysfs_writer.h"

namespace vfio_dra::cmd {

// What the daemon uses to change the node; the defaults are the real kernel. The test daemon
// substitutes a simulated kernel and a hook that can kill it at any step of prepare/unprepare.
struct ServeEnvironment {
  std::function<std::unique_ptr<sysfs::SysfsWriter>(const ServeOptions&)> make_sysfs_writer;
  std::function<void(const std::string&)> before_prepare_step;
  // Where the daemon reads its effective capabilities (CapEff) for the privilege check.
  std::string process_status = "/proc/self/status";
};

// Returns the process exit code. Signals SIGTERM and SIGINT must already be blocked in every
// thread (BlockShutdownSignals) so that only the waiting thread receives them.
// `malloc_tuning_problem` is why the allocator could not be tuned (TuneMallocForServe, which the
// caller runs first), logged.
int RunServe(const ServeOptions& options, const ServeEnvironment& environment = {},
             const std::optional<std::string>& malloc_tuning_problem = std::nullopt);

// Blocks SIGTERM and SIGINT in the calling thread; call first thing in main, before any thread
// exists, so that threads started later inherit the mask.
void BlockShutdownSignals();

// The version string and the User-Agent sent to the API server.
const char* PluginVersion();
std::string UserAgent();

}  // namespace vfio_dra::cmd
