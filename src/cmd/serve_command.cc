#include "cmd/serve_command.h"

#include <malloc.h>
#include <pthread.h>
#include <sys/utsname.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/log.h"
#include "cmd/serve_daemon.h"

#ifndef VFIO_DRA_VERSION
#define VFIO_DRA_VERSION "0.0.0-dev"
#endif

namespace vfio_dra::cmd {

const char* PluginVersion() { return VFIO_DRA_VERSION; }

std::string UserAgent() {
  struct utsname uts {};
  std::string arch = "unknown";
  if (::uname(&uts) == 0) {
    arch = uts.machine;
    if (arch == "x86_64") arch = "amd64";
    if (arch == "aarch64") arch = "arm64";
  }
  return std::string("vfio-dra-plugin/") + PluginVersion() + " (linux/" + arch + ")";
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

namespace {

// glibc gives each thread that allocates an arena of its own, up to eight per core, and each keeps
// its freed pages scattered between live chunks. The daemon allocates little once it has
// published, and its handler threads are reused (their malloc caches stay warm), so one arena
// serves prepares running in parallel as well as two did: with 1,000 devices the idle daemon is
// 17.9 MiB against 19.1 with two (three daemon_bench runs each) and the daemon's CPU per claim at
// 32 at once no higher (two prepare_bench runs each). An operator's MALLOC_ARENA_MAX or
// GLIBC_TUNABLES setting wins. Called before any thread starts.
void LimitMallocArenas() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr ||
      (tunables != nullptr && std::strstr(tunables, "arena_max") != nullptr)) {
    return;
  }
  ::mallopt(M_ARENA_MAX, 1);
}

}  // namespace

int RunServe(const ServeOptions& options, const ServeEnvironment& environment) {
  LimitMallocArenas();
  Logger root = Logger::ToStderr(options.verbosity);
  Logger log = root.WithComponent("serve");
  log.Info(
      "starting",
      {{"version", PluginVersion()}, {"driver", options.driver_name}, {"node", options.node_name}});
  auto daemon = ServeDaemon::Build(options, environment, root);
  if (!daemon.ok()) {
    log.Error("cannot start", {{"error", daemon.error().message}});
    return 1;
  }
  if (Status s = (*daemon)->Start(); !s.ok()) {
    log.Error("cannot start", {{"error", s.error().message}});
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  log.Info("shutting down; ResourceSlices stay in place",
           {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"}});
  (*daemon)->Stop();
  log.Info("stopped");
  return 0;
}

}  // namespace vfio_dra::cmd
