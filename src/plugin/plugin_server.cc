#include "plugin/plugin_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>

#include "base/file_io.h"
#include "plugin/serving_status_service.h"
#include "plugin/socket_server.h"

namespace vfio_dra::plugin {
namespace {

// Owner-only: the kubelet connects as root, and nobody else has business on these sockets.
constexpr mode_t kSocketMode = 0600;
// What running calls get to finish when the plugin stops, before they are cancelled.
constexpr std::chrono::seconds kStopGrace{5};

Result<std::unique_ptr<SocketServer>> StartSocketServer(const std::string& path,
                                                        std::vector<GrpcMethod> methods,
                                                        ServingStatusService& health,
                                                        const char* thread_name, const Logger& log,
                                                        std::chrono::milliseconds close_idle) {
  if (Status s = EnsureDirectory(std::filesystem::path(path).parent_path().string()); !s.ok()) {
    return s.error();
  }
  if (Status s = RemoveStaleSocket(path); !s.ok()) return s.error();
  for (GrpcMethod& method : health.Methods()) methods.push_back(std::move(method));
  return SocketServer::Start(path, kSocketMode, methods, thread_name, log, close_idle);
}

void ShutdownAndUnlink(std::unique_ptr<SocketServer>& server, ServingStatusService& health,
                       const std::string& path, const Logger& log) {
  if (server == nullptr) return;
  health.Shutdown();
  server->Shutdown(kStopGrace);
  server.reset();
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    log.Warn("cannot remove socket", {{"path", path}, {"error", ErrnoText(errno)}});
  }
}

}  // namespace

SocketLayout SocketLayout::For(const std::string& plugin_data_dir, const std::string& registrar_dir,
                               const std::string& driver_name, const std::string& pod_uid) {
  SocketLayout layout;
  const std::string suffix = pod_uid.empty() ? "" : "-" + pod_uid;
  layout.dra_socket = plugin_data_dir + "/dra" + suffix + ".sock";
  layout.registration_socket = registrar_dir + "/" + driver_name + suffix + "-reg.sock";
  layout.lock_file = plugin_data_dir + "/serialize.lock";
  return layout;
}

Status RemoveStaleSocket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return MakeError(ErrorKind::kUnavailable, "cannot inspect " + path + ": " + ErrnoText(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     path +
                         " exists and is not a socket; refusing to replace it (remove it by "
                         "hand if it is not needed)");
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot remove stale socket " + path + ": " + ErrnoText(errno));
  }
  return Status::Ok();
}

Result<std::unique_ptr<PluginServer>> PluginServer::Start(
    const SocketLayout& layout, const std::vector<GrpcMethod>& dra_methods,
    const std::vector<GrpcMethod>& registration_methods, Logger log,
    std::chrono::milliseconds close_idle_dra_connections) {
  std::unique_ptr<PluginServer> server(new PluginServer(layout, std::move(log)));
  // The standard grpc.health.v1 service on both sockets: probes and tools that speak it see the
  // plugin SERVING while it listens and NOT_SERVING while it stops.
  auto dra = StartSocketServer(layout.dra_socket, dra_methods, *server->dra_health_, "dra-grpc",
                               server->log_, close_idle_dra_connections);
  if (!dra.ok()) return dra.error().Wrap("cannot start the DRA service");
  server->dra_server_ = std::move(*dra);
  // gRPC closes idle connections without telling us; the log says that it will.
  server->log_.Info(
      "DRA service listening",
      {{"socket", layout.dra_socket},
       {"close_idle_connections_s",
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(close_idle_dra_connections)
                           .count())}});
  // Only now, with the DRA socket accepting connections, may the kubelet learn about us.
  auto reg = StartSocketServer(layout.registration_socket, registration_methods,
                               *server->registration_health_, "registration", server->log_,
                               std::chrono::milliseconds(0));
  if (!reg.ok()) {
    server->Stop();
    return reg.error().Wrap("cannot start the registration service");
  }
  server->registration_server_ = std::move(*reg);
  server->log_.Info("registration socket ready", {{"socket", layout.registration_socket}});
  return server;
}

PluginServer::PluginServer(SocketLayout layout, Logger log)
    : layout_(std::move(layout)),
      log_(std::move(log)),
      dra_health_(std::make_unique<ServingStatusService>()),
      registration_health_(std::make_unique<ServingStatusService>()) {}

PluginServer::~PluginServer() { Stop(); }

void PluginServer::Stop() {
  ShutdownAndUnlink(registration_server_, *registration_health_, layout_.registration_socket, log_);
  ShutdownAndUnlink(dra_server_, *dra_health_, layout_.dra_socket, log_);
}

}  // namespace vfio_dra::plugin
