// RunServe: the daemon's life: build the API client, the node service and the gRPC servers, run
// until SIGTERM/SIGINT, then stop the servers and remove the sockets. ResourceSlices are left in
// place on shutdown (the kubelet wipes a driver's slices only after it stays away).
#pragma once

#include "plugin/serve_options.h"

namespace vfio_dra::plugin {

// Returns the process exit code. Signals SIGTERM and SIGINT must already be blocked in every
// thread (BlockShutdownSignals) so that only the waiting thread receives them.
int RunServe(const ServeOptions& options);

// Blocks SIGTERM and SIGINT in the calling thread; call first thing in main, before any thread
// exists, so that threads started later inherit the mask.
void BlockShutdownSignals();

// The version string and the User-Agent sent to the API server.
const char* PluginVersion();
std::string UserAgent();

}  // namespace vfio_dra::plugin
