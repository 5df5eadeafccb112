// ServerCall: one RPC in flight on the plugin's gRPC server, the state its handler thread and the
// server's I/O thread share. The handler writes messages and finally a status; the I/O thread
// drains the framed bytes into HTTP/2 DATA frames and sends the status as trailers. CallEvents is
// how a call tells the I/O thread that it has something to send.
// Invariants: everything mutable is under the call's mutex; after Cancel no write succeeds and a
// blocked writer wakes; Finish happens once, after the last Write.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "plugin/grpc_method.h"

namespace vfio_dra::plugin {

// Which stream of which connection has output; the I/O thread looks both up again, so an event
// for a connection or stream that has gone since is dropped.
struct CallEvent {
  uint64_t connection = 0;
  int32_t stream = 0;
};

// A queue of CallEvents and the eventfd that wakes the I/O thread's poll.
class CallEvents {
 public:
  CallEvents();
  ~CallEvents();
  CallEvents(const CallEvents&) = delete;
  CallEvents& operator=(const CallEvents&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Post(CallEvent event);
  // Wakes the poll without an event (the server's own state changed).
  void Wake();
  // Clears the eventfd: done right after poll returns, before the I/O thread looks at anything a
  // wakeup could be about, so that no later wakeup is lost.
  void ClearWakeup();
  // Takes the queued events (posted before their wakeup, so none is missed).
  std::vector<CallEvent> Take();

 private:
  int fd_ = -1;
  std::mutex mu_;
  std::vector<CallEvent> events_;
};

class ServerCall final : public CallContext, public MessageSink {
 public:
  ServerCall(CallEvent id, std::string peer,
             std::optional<std::chrono::steady_clock::time_point> deadline, CallEvents& events);

  // CallContext
  bool IsCancelled() const override { return cancelled_.load(); }
  std::optional<std::chrono::steady_clock::time_point> deadline() const override {
    return deadline_;
  }
  const std::string& peer() const override { return peer_; }

  // MessageSink: frames `message` and queues it; waits while more than kMaxQueuedBytes wait to
  // be sent.
  bool Write(std::string message) override;

  // The handler is done; `status` goes out as the trailers.
  void Finish(GrpcStatus status);
  // A unary handler is done: its one `message` (sent only when `status` is ok) and `status`, in
  // one hand-over to the I/O thread, so that both leave in one write.
  void Answer(const std::string& message, GrpcStatus status);

  // The caller reset the stream or went away, or the server stops.
  void Cancel();

  // I/O thread: copies up to `size` queued bytes into `out`.
  size_t TakeOutput(uint8_t* out, size_t size);
  // I/O thread: the final status once the handler finished and all output was taken.
  std::optional<GrpcStatus> StatusIfDrained();
  bool HasOutput();

 private:
  static constexpr size_t kMaxQueuedBytes = size_t{1} << 20;
  // Sent bytes are dropped from the front of the buffer once there are this many, so a stream
  // that is never quite drained does not keep everything it ever sent.
  static constexpr size_t kCompactAfterBytes = size_t{64} << 10;

  const CallEvent id_;
  const std::string peer_;
  const std::optional<std::chrono::steady_clock::time_point> deadline_;
  CallEvents& events_;
  std::atomic<bool> cancelled_{false};

  std::mutex mu_;
  std::condition_variable drained_;
  std::string out_;
  size_t out_pos_ = 0;
  bool finished_ = false;
  GrpcStatus status_;
};

}  // namespace vfio_dra::plugin
