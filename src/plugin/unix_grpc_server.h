// UnixGrpcServer: the gRPC server of one plugin socket, written on nghttp2 rather than gRPC C++:
// the kubelet's calls are unary or server-streaming over a local unix socket, and gRPC C++'s
// runtime (its threads, timers and several MiB of resident code) costs every node more than the
// protocol needs. One I/O thread polls the listening socket and the connections with no timeout;
// each call runs its handler on a thread of its own (reused from earlier calls when one is idle),
// so device work never holds up other calls. A connection with no call open for
// `close_idle_after` is sent GOAWAY and closed; its client reconnects on its next call. (Kubelet
// 1.34.0 deadlocks when its own 30-minute idle timer takes the connection to the plugin idle;
// a connection the server ends is an ordinary reconnect for it.)
// Invariants: the socket file appears only once it accepts connections (bound under a hidden
// name, then renamed); Shutdown lets running calls finish for the grace period, then cancels
// them, waits for every handler to return and sends what they answered before closing; at most
// kMaxRunningCalls handlers run at once, whatever the clients do.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/elastic_thread_pool.h"
#include "base/log.h"
#include "base/result.h"
#include "plugin/grpc_method.h"
#include "plugin/server_call.h"

namespace vfio_dra::plugin {

class GrpcConnection;

class UnixGrpcServer {
 public:
  // Listens on `path` (mode `mode`) and serves `methods`. `thread_name` names the I/O thread;
  // handler threads ("grpc-call") end after `handler_idle_lifetime` without a call. Connections
  // idle for `close_idle_after` are closed (zero: never).
  static Result<std::unique_ptr<UnixGrpcServer>> Start(
      const std::string& path, mode_t mode, const std::vector<GrpcMethod>& methods,
      const char* thread_name, Logger log,
      std::chrono::milliseconds handler_idle_lifetime = std::chrono::seconds(10),
      std::chrono::milliseconds close_idle_after = std::chrono::milliseconds(0));
  ~UnixGrpcServer();  // Shutdown with no grace
  UnixGrpcServer(const UnixGrpcServer&) = delete;
  UnixGrpcServer& operator=(const UnixGrpcServer&) = delete;

  // Stops accepting, tells clients to open no new calls, lets running calls finish for up to
  // `grace`, cancels the rest and waits for their handlers, then hands their answers to the
  // clients for up to 2 s. Idempotent; a second caller returns once the first is done. Does not
  // unlink the socket file (the owner of the path does).
  void Shutdown(std::chrono::milliseconds grace);

 private:
  UnixGrpcServer(std::string path, std::unordered_map<std::string, GrpcMethod> methods, Logger log,
                 std::chrono::milliseconds handler_idle_lifetime,
                 std::chrono::milliseconds close_idle_after);
  void Run();
  void Accept();
  void Drop(uint64_t id, const char* why);
  void StartCall(const GrpcMethod& method, const std::shared_ptr<ServerCall>& call,
                 std::string message);
  void RunHandler(const GrpcMethod& method, ServerCall& call, const std::string& message);
  void HandlerDone(const ServerCall* call);
  void CancelAllCalls();
  // Sends GOAWAY to connections idle for close_idle_after_; returns when the next one will be.
  std::optional<std::chrono::steady_clock::time_point> CloseIdleConnections(bool stopping);

  const std::string path_;
  int listen_fd_ = -1;
  const std::unordered_map<std::string, GrpcMethod> methods_;
  Logger log_;
  const std::chrono::milliseconds close_idle_after_;
  CallEvents events_;
  ElasticThreadPool handlers_;
  std::thread io_thread_;
  // The I/O thread's alone.
  uint64_t next_connection_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<GrpcConnection>> connections_;
  // Accepting pauses while the process is out of descriptors or memory, instead of spinning on a
  // listening socket that stays readable.
  std::chrono::steady_clock::time_point accept_paused_until_{};

  std::mutex mu_;
  std::condition_variable handlers_done_;
  std::vector<std::shared_ptr<ServerCall>> running_;  // calls whose handler has not returned
  bool stopping_ = false;                             // no new connections or calls
  bool exiting_ = false;                              // the I/O thread flushes and ends
  bool shutdown_started_ = false;
  bool shutdown_done_ = false;
};

}  // namespace vfio_dra::plugin
