#include "cmd/serve_command.h"

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

int RunServe(const ServeOptions& options, const ServeEnvironment& environment,
             const std::optional<std::string>& malloc_tuning_problem) {
  Logger root = Logger::ToStderr(options.verbosity);
  Logger log = root.WithComponent("serve");
  log.Info(
      "starting",
      {{"version", PluginVersion()}, {"driver", options.driver_name}, {"node", options.node_name}});
  if (malloc_tuning_problem) {
    log.Warn("running with glibc's default malloc thread cache (prepares at once cost more CPU)",
             {{"problem", *malloc_tuning_problem}});
  }
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
