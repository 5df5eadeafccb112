#include "plugin/unix_grpc_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>

#include "base/file_io.h"
#include "base/thread_name.h"
#include "plugin/grpc_connection.h"

namespace vfio_dra::plugin {
namespace {

// How long a stopping server keeps handing the last answers to slow readers.
constexpr auto kFinalFlush = std::chrono::seconds(2);
// Handlers running at once, cancelled ones included: the kubelet runs a call per pod being
// started or stopped, far below this; a client that resets streams while their handlers still
// run cannot make the plugin start threads without end.
constexpr size_t kMaxRunningCalls = 256;
constexpr auto kAcceptPause = std::chrono::seconds(1);
// Between the GOAWAY notice to an idle connection's client and the final GOAWAY: the round trip
// in which a call the client had already sent still reaches the server and is served.
constexpr auto kGoAwayNoticeGrace = std::chrono::seconds(1);

int PollTimeoutMs(std::chrono::steady_clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 60'000));
}

Result<int> ListenUnix(const std::string& path, mode_t mode) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // The socket is made under a hidden name (the kubelet's plugin watcher skips dot files) and
  // renamed into place once it listens with its final mode, so whoever sees the name can connect
  // at once.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const std::string temp = dir + "/.vfio-dra-" + std::to_string(::getpid()) + "-" +
                           std::filesystem::path(path).filename().string();
  if (temp.size() >= sizeof(addr.sun_path) || path.size() >= sizeof(addr.sun_path)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "unix socket path " + path + " is too long (a socket path, with its " +
                         "temporary name while binding, must be shorter than " +
                         std::to_string(sizeof(addr.sun_path)) + " bytes)");
  }
  std::memcpy(addr.sun_path, temp.c_str(), temp.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable, "cannot create a unix socket: " + ErrnoText(errno));
  }
  ::unlink(temp.c_str());
  auto fail = [&](const std::string& what) -> Error {
    const int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    return MakeError(ErrorKind::kUnavailable, what + ": " + ErrnoText(err));
  };
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("cannot bind unix socket " + temp + " (is the directory writable?)");
  }
  if (::chmod(temp.c_str(), mode) != 0) return fail("cannot set the mode of " + temp);
  if (::listen(fd, SOMAXCONN) != 0) return fail("cannot listen on " + temp);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    return fail("cannot put socket " + path + " in place");
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<UnixGrpcServer>> UnixGrpcServer::Start(
    const std::string& path, mode_t mode, const std::vector<GrpcMethod>& methods,
    const char* thread_name, Logger log, std::chrono::milliseconds handler_idle_lifetime,
    std::chrono::milliseconds close_idle_after) {
  std::unordered_map<std::string, GrpcMethod> table;
  for (const GrpcMethod& method : methods) {
    if (!table.emplace(method.path, method).second) {
      return MakeError(ErrorKind::kInternal, "gRPC method " + method.path + " registered twice");
    }
  }
  std::unique_ptr<UnixGrpcServer> server(new UnixGrpcServer(
      path, std::move(table), std::move(log), handler_idle_lifetime, close_idle_after));
  if (!server->events_.ok()) {
    return MakeError(ErrorKind::kUnavailable, "cannot create the eventfd of the gRPC server for " +
                                                  path + ": " + ErrnoText(errno));
  }
  auto fd = ListenUnix(path, mode);
  if (!fd.ok()) return fd.error();
  server->listen_fd_ = *fd;
  try {
    server->io_thread_ = std::thread([raw = server.get(), name = std::string(thread_name)] {
      NameThisThread(name.c_str());
      raw->Run();
    });
  } catch (const std::system_error& e) {
    ::unlink(path.c_str());
    return MakeError(
        ErrorKind::kUnavailable,
        "cannot start the I/O thread of the gRPC server for " + path + ": " + e.what());
  }
  return server;
}

UnixGrpcServer::UnixGrpcServer(std::string path,
                               std::unordered_map<std::string, GrpcMethod> methods, Logger log,
                               std::chrono::milliseconds handler_idle_lifetime,
                               std::chrono::milliseconds close_idle_after)
    : path_(std::move(path)),
      methods_(std::move(methods)),
      log_(std::move(log)),
      close_idle_after_(close_idle_after),
      handlers_("grpc-call", handler_idle_lifetime) {}

UnixGrpcServer::~UnixGrpcServer() {
  Shutdown(std::chrono::milliseconds(0));
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void UnixGrpcServer::Run() {
  bool stopping = false;
  std::optional<std::chrono::steady_clock::time_point> flush_until;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const bool accepting = listen_fd_ >= 0 && !stopping && now >= accept_paused_until_;
    // Before the poll set is made: closing may drop a connection.
    std::optional<std::chrono::steady_clock::time_point> wake_at = CloseIdleConnections(stopping);
    std::vector<pollfd> fds;
    std::vector<uint64_t> polled;
    fds.push_back({events_.fd(), POLLIN, 0});
    if (accepting) fds.push_back({listen_fd_, POLLIN, 0});
    const size_t first_connection = fds.size();
    for (auto& [id, connection] : connections_) {
      // No POLLOUT unless a write would have blocked: an idle server sleeps.
      const short want = connection->blocked() ? POLLIN | POLLOUT : POLLIN;
      fds.push_back({connection->fd(), want, 0});
      polled.push_back(id);
    }
    // No timeout unless accepting is paused, the last answers are being handed over, or a
    // connection is idle.
    if (flush_until) {
      wake_at = flush_until;
    } else if (listen_fd_ >= 0 && !stopping && !accepting) {
      wake_at = std::min(wake_at.value_or(accept_paused_until_), accept_paused_until_);
    }
    const int timeout = wake_at ? PollTimeoutMs(*wake_at) : -1;
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      log_.Error("gRPC server poll failed; the socket stops serving",
                 {{"socket", path_}, {"error", ErrnoText(errno)}});
      break;
    }
    events_.ClearWakeup();
    bool exiting = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      exiting = exiting_;
      if (stopping_ && !stopping) {
        stopping = true;
        for (auto& [id, connection] : connections_) connection->GoAway();
        // Connections waiting in the backlog are refused rather than left hanging.
        if (listen_fd_ >= 0) ::close(listen_fd_);
        listen_fd_ = -1;
      }
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      const short revents = fds[first_connection + i].revents;
      auto found = connections_.find(polled[i]);
      if (found == connections_.end()) continue;
      GrpcConnection& connection = *found->second;
      bool alive = true;
      if ((revents & (POLLIN | POLLHUP | POLLERR)) != 0) alive = connection.OnReadable();
      if (alive && (revents & POLLOUT) != 0) alive = connection.Flush();
      if (!alive) Drop(polled[i], "the connection ended");
    }
    for (const CallEvent& event : events_.Take()) {
      auto it = connections_.find(event.connection);
      if (it != connections_.end()) it->second->OnCallEvent(event.stream);
    }
    if (accepting && (fds[1].revents & POLLIN) != 0) Accept();
    if (exiting && !flush_until) flush_until = std::chrono::steady_clock::now() + kFinalFlush;
    for (auto it = connections_.begin(); it != connections_.end();) {
      const uint64_t id = it->first;
      GrpcConnection& connection = *it->second;
      ++it;
      if (!connection.Flush()) {
        Drop(id, "the connection ended");
      } else if (connection.Finished() || (flush_until && connection.Quiet())) {
        connections_.erase(id);
      }
    }
    if (flush_until && (connections_.empty() || std::chrono::steady_clock::now() >= *flush_until)) {
      break;
    }
  }
  for (const auto& [id, connection] : connections_) {
    log_.Warn("closing a connection with answers not yet delivered: the plugin is stopping",
              {{"socket", path_}, {"peer", connection->peer()}});
  }
  connections_.clear();
}

std::optional<std::chrono::steady_clock::time_point> UnixGrpcServer::CloseIdleConnections(
    bool stopping) {
  if (close_idle_after_.count() <= 0 || stopping) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> next;
  const auto wake_by = [&](std::chrono::steady_clock::time_point at) {
    next = std::min(next.value_or(at), at);
  };
  std::vector<uint64_t> notice;
  std::vector<uint64_t> final_goaway;
  for (const auto& [id, connection] : connections_) {
    if (const auto noticed = connection->NoticedAt()) {
      if (now >= *noticed + kGoAwayNoticeGrace) {
        final_goaway.push_back(id);
      } else {
        wake_by(*noticed + kGoAwayNoticeGrace);
      }
    } else if (const auto since = connection->IdleSince()) {
      if (now >= *since + close_idle_after_) {
        notice.push_back(id);
      } else {
        wake_by(*since + close_idle_after_);
      }
    }
  }
  for (uint64_t id : notice) {
    GrpcConnection& connection = *connections_.at(id);
    log_.Info("closing an idle gRPC connection; the client reconnects on its next call",
              {{"socket", path_},
               {"peer", connection.peer()},
               {"idle_after_s",
                std::to_string(
                    std::chrono::duration_cast<std::chrono::seconds>(close_idle_after_).count())}});
    connection.NoticeGoAway();
    if (connection.Flush()) {
      wake_by(now + kGoAwayNoticeGrace);
    } else {
      Drop(id, "the connection ended");
    }
  }
  for (uint64_t id : final_goaway) {
    GrpcConnection& connection = *connections_.at(id);
    connection.GoAway();
    if (connection.Flush()) {
      // Once it is out and no call is open the connection is finished: the loop's next pass,
      // right away, closes it.
      wake_by(now);
    } else {
      Drop(id, "the connection ended");
    }
  }
  return next;
}

void UnixGrpcServer::Drop(uint64_t id, const char* why) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  if (!it->second->failure().empty()) {
    log_.Warn("closing a gRPC connection",
              {{"socket", path_}, {"peer", it->second->peer()}, {"reason", it->second->failure()}});
  } else {
    log_.Debug(4, why, {{"socket", path_}, {"peer", it->second->peer()}});
  }
  connections_.erase(it);
}

void UnixGrpcServer::Accept() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: the pending connection stays in the backlog and the socket
      // stays readable, so accepting pauses rather than spinning.
      log_.Warn("cannot accept a connection; accepting pauses for a second",
                {{"socket", path_}, {"error", ErrnoText(errno)}});
      accept_paused_until_ = std::chrono::steady_clock::now() + kAcceptPause;
      return;
    }
    const uint64_t id = next_connection_++;
    auto connection = std::make_unique<GrpcConnection>(
        fd, id, methods_, events_,
        [this](const GrpcMethod& method, const std::shared_ptr<ServerCall>& call,
               std::string message) { StartCall(method, call, std::move(message)); });
    if (!connection->Open()) {
      log_.Warn("cannot set up an HTTP/2 session for a new connection",
                {{"socket", path_}, {"peer", connection->peer()}});
      continue;
    }
    connections_.emplace(id, std::move(connection));
  }
}

void UnixGrpcServer::StartCall(const GrpcMethod& method, const std::shared_ptr<ServerCall>& call,
                               std::string message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      call->Finish({GrpcCode::kUnavailable, "the plugin is stopping"});
      return;
    }
    if (running_.size() >= kMaxRunningCalls) {
      call->Finish({GrpcCode::kResourceExhausted,
                    std::to_string(running_.size()) + " calls are already running on " + path_ +
                        "; " + method.path + " is refused until some finish"});
      return;
    }
    running_.push_back(call);
  }
  try {
    handlers_.Run([this, &method, call, message = std::move(message)] {
      RunHandler(method, *call, message);
      HandlerDone(call.get());
    });
  } catch (const std::system_error& e) {
    HandlerDone(call.get());
    call->Finish({GrpcCode::kResourceExhausted,
                  "cannot start a thread for " + method.path + ": " + e.what()});
  }
}

void UnixGrpcServer::RunHandler(const GrpcMethod& method, ServerCall& call,
                                const std::string& message) {
  // No exception may leave a handler thread: it would end the process.
  try {
    if (method.unary) {
      std::string response;
      GrpcStatus status = method.unary(message, call, &response);
      call.Answer(response, std::move(status));
    } else {
      call.Finish(method.server_streaming(message, call, call));
    }
  } catch (const std::exception& e) {
    log_.Error("gRPC handler failed", {{"method", method.path}, {"error", e.what()}});
    call.Finish({GrpcCode::kInternal, method.path + " failed: " + e.what()});
  } catch (...) {
    log_.Error("gRPC handler failed", {{"method", method.path}});
    call.Finish({GrpcCode::kInternal, method.path + " failed"});
  }
}

void UnixGrpcServer::HandlerDone(const ServerCall* call) {
  std::lock_guard<std::mutex> lock(mu_);
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const auto& c) { return c.get() == call; }),
                 running_.end());
  // Notified under the lock: once Shutdown sees no handler left, this thread touches nothing of
  // the server again.
  handlers_done_.notify_all();
}

void UnixGrpcServer::CancelAllCalls() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& call : running_) call->Cancel();
}

void UnixGrpcServer::Shutdown(std::chrono::milliseconds grace) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (shutdown_started_) {
      handlers_done_.wait(lock, [&] { return shutdown_done_; });
      return;
    }
    shutdown_started_ = true;
    stopping_ = true;
  }
  events_.Wake();
  {
    std::unique_lock<std::mutex> lock(mu_);
    handlers_done_.wait_for(lock, grace, [&] { return running_.empty(); });
  }
  CancelAllCalls();
  {
    std::unique_lock<std::mutex> lock(mu_);
    handlers_done_.wait(lock, [&] { return running_.empty(); });
    exiting_ = true;
  }
  events_.Wake();
  if (io_thread_.joinable()) io_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_done_ = true;
  }
  handlers_done_.notify_all();
}

}  // namespace vfio_dra::plugin
