// SocketServer: one gRPC C++ server (grpc::Server) on one unix socket, serving GrpcMethods. The
// methods are dispatched by their full path through gRPC's asynchronous generic service, so the
// services stay plain C++ over generated messages (grpc_method.h); one thread of ours takes the
// call events from the server's completion queue and sleeps while none come; each call's handler
// runs on a thread of its own (reused from earlier calls when one is idle), because handlers block
// on device work and the queue's thread must not. gRPC does the protocol: flow control, message
// limits (4 MiB each way), deadlines, cancellation, and closing connections idle for
// `close_idle_after` (GRPC_ARG_MAX_CONNECTION_IDLE_MS: kubelet 1.34.0 deadlocks when its own
// 30-minute idle timer takes the connection to the plugin idle; a connection the server ends is an
// ordinary reconnect for it). Invariants: the socket is bound at its final name and no other name
// appears in its directory (the kubelet's plugin watcher stats every name that does); at most
// kMaxRunningCalls handlers run at once, whatever the clients do; Shutdown lets running calls
// finish for the grace period, then cancels them and returns once every handler has returned.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/result.h"
#include "plugin/grpc_method.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace vfio_dra::plugin {

class GenericDispatcher;

class SocketServer {
 public:
  // Listens on `path` (mode `mode`) and serves `methods`; `thread_name` names the handler threads.
  // Connections with no call open for `close_idle_after` are closed (zero: never).
  static Result<std::unique_ptr<SocketServer>> Start(
      const std::string& path, mode_t mode, const std::vector<GrpcMethod>& methods,
      const char* thread_name, Logger log,
      std::chrono::milliseconds close_idle_after = std::chrono::milliseconds(0));
  ~SocketServer();  // Shutdown with no grace
  SocketServer(const SocketServer&) = delete;
  SocketServer& operator=(const SocketServer&) = delete;

  // Stops accepting, lets running calls finish for up to `grace`, cancels the rest and waits for
  // their handlers. Idempotent. Does not unlink the socket file (the owner of the path does).
  void Shutdown(std::chrono::milliseconds grace);

 private:
  SocketServer(std::unique_ptr<GenericDispatcher> dispatcher, std::unique_ptr<grpc::Server> server);

  // Declared first: it serves the calls of server_, which is stopped before it goes.
  std::unique_ptr<GenericDispatcher> dispatcher_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

}  // namespace vfio_dra::plugin
