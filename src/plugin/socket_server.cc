#include "plugin/socket_server.h"

#include <fmt/format.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "base/elastic_thread_pool.h"
#include "base/file_io.h"
#include "base/thread_name.h"

namespace vfio_dra::plugin {
namespace {

// Handlers running at once, cancelled ones included: the kubelet runs a call per pod being
// started or stopped, far below this; a client that cancels calls while their handlers still
// run cannot make the plugin start threads without end.
constexpr size_t kMaxRunningCalls = 256;
// A handler thread with no call for this long ends, so an idle plugin keeps none.
constexpr auto kHandlerIdleLifetime = std::chrono::seconds(10);

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::Status ToGrpc(const GrpcStatus& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code), status.message);
}

// The call's deadline on the steady clock (what Deadline and waits use); nullopt when the caller
// set none (gRPC reports an infinite one as a far future).
std::optional<std::chrono::steady_clock::time_point> SteadyDeadline(
    std::chrono::system_clock::time_point at) {
  const auto now = std::chrono::system_clock::now();
  if (at >= now + std::chrono::hours(24 * 365)) return std::nullopt;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(at - now);
}

}  // namespace

// The generic service of one server: requests its calls on the server's completion queue,
// whose one thread (below) hands each event to its call, looks each call's method up and runs
// its handler on the handler threads. The asynchronous API rather than the callback one: gRPC
// 1.51 serves callbacks on its own "nexting" threads, which wake 1.1 times a second each even
// with no call (hard-coded); a thread of ours blocked in CompletionQueue::Next wakes only for an
// event. Outlives its server's calls: SocketServer stops the server, waits until every call is
// gone, and only then shuts the queue down.
class GenericDispatcher {
 public:
  GenericDispatcher(std::unordered_map<std::string, GrpcMethod> methods, const char* thread_name,
                    Logger log)
      : methods_(std::move(methods)),
        log_(std::move(log)),
        handlers_(thread_name, kHandlerIdleLifetime) {}
  ~GenericDispatcher() { StopQueue(); }
  GenericDispatcher(const GenericDispatcher&) = delete;
  GenericDispatcher& operator=(const GenericDispatcher&) = delete;

  grpc::AsyncGenericService& service() { return service_; }
  // Takes the server's queue, requests the first call and starts the queue's thread.
  void Serve(std::unique_ptr<grpc::ServerCompletionQueue> queue);
  // Asks gRPC for the next call (one waiting request at a time: calls are requested again as
  // soon as one arrives, before its handler runs).
  void RequestNextCall();
  const GrpcMethod* Find(const std::string& method) const {
    const auto it = methods_.find(method);
    return it == methods_.end() ? nullptr : &it->second;
  }

  // A place for one more running handler; false when kMaxRunningCalls already run.
  bool Admit() {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ >= kMaxRunningCalls) return false;
    ++running_;
    return true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    if (running_ == 0) idle_.notify_all();
  }
  // Calls in existence, requested ones included; the queue may shut down only at zero.
  void AddCall() {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
  }
  void RemoveCall() {
    std::lock_guard<std::mutex> lock(mu_);
    --calls_;
    if (calls_ == 0) idle_.notify_all();
  }
  // Returns once no handler runs and no call is left (the server must be shut down, so that the
  // waiting request has come back).
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return running_ == 0 && calls_ == 0; });
  }
  // Shuts the queue down and joins its thread; only once WaitIdle returned.
  void StopQueue() {
    if (!queue_thread_.joinable()) return;
    queue_->Shutdown();
    queue_thread_.join();
  }

  ElasticThreadPool& handlers() { return handlers_; }
  const Logger& log() const { return log_; }

 private:
  const std::unordered_map<std::string, GrpcMethod> methods_;
  Logger log_;
  ElasticThreadPool handlers_;
  grpc::AsyncGenericService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::thread queue_thread_;
  std::mutex mu_;
  std::condition_variable idle_;
  size_t running_ = 0;
  size_t calls_ = 0;
};

namespace {

// One call: requested from gRPC, then reads the single request message, runs the handler on a
// handler thread and answers through gRPC. Every event of the call (requested, read, write,
// finish, done) comes back on the queue's thread as one of its Events. Deletes itself on that
// thread once gRPC says the call is done and its finish has completed (they come in either
// order), or when the request comes back empty (the server is shutting down: gRPC then never
// reports the call done).
class Call final : public CallContext, public MessageSink {
 public:
  enum class Kind { kRequested, kRead, kWrite, kFinish, kDone };
  struct Event {
    Call* call;
    Kind kind;
  };

  explicit Call(GenericDispatcher& dispatcher) : dispatcher_(dispatcher) { dispatcher_.AddCall(); }
  ~Call() override { dispatcher_.RemoveCall(); }

  void Request(grpc::ServerCompletionQueue* queue) {
    context_.AsyncNotifyWhenDone(&done_);
    dispatcher_.service().RequestCall(&context_, &stream_, queue, queue, &requested_);
  }

  // On the queue's thread.
  void OnEvent(Kind kind, bool ok) {
    switch (kind) {
      case Kind::kRequested:
        return OnRequested(ok);
      case Kind::kRead:
        return OnRead(ok);
      case Kind::kWrite: {
        {
          std::lock_guard<std::mutex> lock(mu_);
          write_done_ = true;
          write_ok_ = ok;
        }
        write_finished_.notify_all();
        return;
      }
      case Kind::kFinish:
        finish_done_ = true;
        break;
      case Kind::kDone:
        done_seen_ = true;
        if (context_.IsCancelled()) Cancel();
        break;
    }
    if (finish_done_ && done_seen_) delete this;
  }

  // CallContext
  bool IsCancelled() const override { return cancelled_.load(); }
  std::optional<std::chrono::steady_clock::time_point> deadline() const override {
    return deadline_;
  }
  const std::string& peer() const override { return peer_; }
  void OnCancel(std::function<void()> wake) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_.load()) {
        on_cancel_.push_back(std::move(wake));
        return;
      }
    }
    wake();
  }

  // MessageSink: one write in flight at a time; waits until gRPC took it or the call ended.
  bool Write(std::string message) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (cancelled_.load()) return false;
    write_buffer_ = ToBuffer(message);
    write_done_ = false;
    lock.unlock();
    stream_.Write(write_buffer_, &write_);
    lock.lock();
    write_finished_.wait(lock, [&] { return write_done_; });
    return write_ok_;
  }

 private:
  void OnRequested(bool ok) {
    if (!ok) {
      delete this;
      return;
    }
    dispatcher_.RequestNextCall();
    peer_ = context_.peer();
    deadline_ = SteadyDeadline(context_.deadline());
    method_ = dispatcher_.Find(context_.method());
    if (method_ == nullptr) {
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unknown method " + context_.method()));
      return;
    }
    stream_.Read(&request_, &read_);
  }

  void OnRead(bool ok) {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "the call carried no request message"));
      return;
    }
    if (!dispatcher_.Admit()) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "too many calls are running; try again"));
      return;
    }
    try {
      dispatcher_.handlers().Run([this] { Serve(); });
    } catch (const std::system_error& e) {
      dispatcher_.Release();
      dispatcher_.log().Warn("cannot start a thread for a gRPC call", {{"error", e.what()}});
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "cannot start a thread for the call; try again"));
    }
  }

  void Finish(const grpc::Status& status) { stream_.Finish(status, &finish_); }

  // Runs the wakes the handler left; on the queue's thread, outside mu_: a wake takes its
  // service's lock, under which the service asks IsCancelled.
  void Cancel() {
    cancelled_.store(true);
    std::vector<std::function<void()>> wakes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wakes.swap(on_cancel_);
    }
    for (const auto& wake : wakes) wake();
  }

  // On a handler thread. Exceptions end here, as an INTERNAL status, never in gRPC's threads.
  void Serve() {
    const std::string request = ToString(request_);
    GrpcStatus status;
    std::string response;
    try {
      if (method_->unary) {
        status = method_->unary(request, *this, &response);
      } else {
        status = method_->server_streaming(request, *this, *this);
      }
    } catch (const std::exception& e) {
      status = GrpcStatus{GrpcCode::kInternal, std::string("the handler failed: ") + e.what()};
    }
    dispatcher_.Release();
    if (status.ok() && method_->unary) {
      response_ = ToBuffer(response);
      stream_.WriteAndFinish(response_, grpc::WriteOptions(), grpc::Status::OK, &finish_);
    } else {
      Finish(ToGrpc(status));
    }
    // `this` may be gone from here on.
  }

  GenericDispatcher& dispatcher_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_{&context_};
  Event requested_{this, Kind::kRequested};
  Event read_{this, Kind::kRead};
  Event write_{this, Kind::kWrite};
  Event finish_{this, Kind::kFinish};
  Event done_{this, Kind::kDone};
  // Set on the queue's thread before the handler starts, read-only after.
  const GrpcMethod* method_ = nullptr;
  std::string peer_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  // The queue's thread's alone.
  bool finish_done_ = false;
  bool done_seen_ = false;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  mutable std::vector<std::function<void()>> on_cancel_;
  std::condition_variable write_finished_;
  grpc::ByteBuffer write_buffer_;
  bool write_done_ = false;
  bool write_ok_ = false;
};

}  // namespace

void GenericDispatcher::Serve(std::unique_ptr<grpc::ServerCompletionQueue> queue) {
  queue_ = std::move(queue);
  RequestNextCall();
  queue_thread_ = std::thread([this] {
    NameThisThread("grpc-queue");
    void* tag = nullptr;
    bool ok = false;
    while (queue_->Next(&tag, &ok)) {
      auto* event = static_cast<Call::Event*>(tag);
      event->call->OnEvent(event->kind, ok);
    }
  });
}

void GenericDispatcher::RequestNextCall() { (new Call(*this))->Request(queue_.get()); }

Result<std::unique_ptr<SocketServer>> SocketServer::Start(
    const std::string& path, mode_t mode, const std::vector<GrpcMethod>& methods,
    const char* thread_name, Logger log, std::chrono::milliseconds close_idle_after) {
  std::unordered_map<std::string, GrpcMethod> table;
  for (const GrpcMethod& method : methods) {
    if (!table.emplace(method.path, method).second) {
      return MakeError(ErrorKind::kInternal, "gRPC method " + method.path + " registered twice");
    }
  }
  // The socket is bound at its final name, as the kubelet's plugin watcher expects. It stats
  // every name created in its directory before it looks at the name; a socket bound under a
  // hidden name and renamed into place is gone by then, and the kubelet logged "Error when
  // handling create event" on every start of the plugin. A connection tried in the instant
  // between bind and listen is refused, and the kubelet's registration retries it. Connecting
  // needs write permission, which the usual umask (022) leaves to the owner alone from the
  // start; `mode` is set right after.
  constexpr size_t kMaxPath = sizeof(sockaddr_un::sun_path);
  if (path.size() >= kMaxPath) {
    return MakeError(ErrorKind::kInvalidArgument,
                     fmt::format("unix socket path {} is too long: a socket path must be shorter "
                                 "than {} bytes; use a shorter directory",
                                 path, kMaxPath));
  }
  auto dispatcher =
      std::make_unique<GenericDispatcher>(std::move(table), thread_name, std::move(log));
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterAsyncGenericService(&dispatcher->service());
  std::unique_ptr<grpc::ServerCompletionQueue> queue = builder.AddCompletionQueue();
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  builder.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  if (close_idle_after.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(std::min<int64_t>(
                                   close_idle_after.count(), std::numeric_limits<int>::max())));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot listen on unix socket " + path + " (is the directory writable?)");
  }
  dispatcher->Serve(std::move(queue));
  std::unique_ptr<SocketServer> result(new SocketServer(std::move(dispatcher), std::move(server)));
  auto fail = [&](const std::string& what) -> Error {
    const int err = errno;
    result->Shutdown(std::chrono::milliseconds(0));
    ::unlink(path.c_str());
    return MakeError(ErrorKind::kUnavailable, what + ": " + ErrnoText(err));
  };
  if (::chmod(path.c_str(), mode) != 0) return fail("cannot set the mode of " + path);
  return result;
}

SocketServer::SocketServer(std::unique_ptr<GenericDispatcher> dispatcher,
                           std::unique_ptr<grpc::Server> server)
    : dispatcher_(std::move(dispatcher)), server_(std::move(server)) {}

SocketServer::~SocketServer() { Shutdown(std::chrono::milliseconds(0)); }

void SocketServer::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_) return;
  shut_down_ = true;
  // gRPC cancels the calls still running at the deadline (their handlers see IsCancelled and
  // OnCancel) and returns once they are done.
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  dispatcher_->WaitIdle();
  dispatcher_->StopQueue();
}

}  // namespace vfio_dra::plugin
