// PluginServer: the two unix-socket gRPC servers (SocketServer, on gRPC C++) the kubelet talks
// to, started and stopped in the order the kubelet relies on: the DRA service listens before the
// registration socket appears (so a 1.34+ kubelet never sees us registered but unreachable), and on
// stop the registration socket goes first. Stale socket files are unlinked before bind; both are
// removed on stop.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/result.h"
#include "plugin/grpc_method.h"

namespace vfio_dra::plugin {

class ServingStatusService;
class SocketServer;

struct SocketLayout {
  std::string dra_socket;           // <plugin-data-dir>/dra[-<uid>].sock
  std::string registration_socket;  // <registrar-dir>/<driver>[-<uid>]-reg.sock
  std::string lock_file;            // <plugin-data-dir>/serialize.lock

  // `pod_uid` (may be empty) keeps the sockets of two instances of a rolling update apart.
  static SocketLayout For(const std::string& plugin_data_dir, const std::string& registrar_dir,
                          const std::string& driver_name, const std::string& pod_uid);
};

// Removes a leftover socket file at `path` (from a crashed instance). A path that exists and is
// not a socket is an error: we never delete a file we did not create.
Status RemoveStaleSocket(const std::string& path);

class PluginServer {
 public:
  // `dra_methods` are served on the DRA socket, `registration_methods` on the registration
  // socket; both also serve grpc.health.v1. DRA connections with no call open for
  // `close_idle_dra_connections` are closed (zero: never; see SocketServer).
  static Result<std::unique_ptr<PluginServer>> Start(
      const SocketLayout& layout, const std::vector<GrpcMethod>& dra_methods,
      const std::vector<GrpcMethod>& registration_methods, Logger log,
      std::chrono::milliseconds close_idle_dra_connections = std::chrono::milliseconds(0));
  ~PluginServer();
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Stops both servers (registration first) and removes both socket files. Idempotent.
  void Stop();

 private:
  PluginServer(SocketLayout layout, Logger log);

  SocketLayout layout_;
  Logger log_;
  // Declared before the servers that serve them, so they outlive those servers.
  std::unique_ptr<ServingStatusService> dra_health_;
  std::unique_ptr<ServingStatusService> registration_health_;
  std::unique_ptr<SocketServer> dra_server_;
  std::unique_ptr<SocketServer> registration_server_;
};

}  // namespace vfio_dra::plugin
