#include "plugin/server_call.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

namespace vfio_dra::plugin {

CallEvents::CallEvents() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

CallEvents::~CallEvents() {
  if (fd_ >= 0) ::close(fd_);
}

void CallEvents::Post(CallEvent event) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Events already queued have had their wakeup, and the I/O thread clears the eventfd before it
    // takes the queue, so it takes this one with them: a burst of answers costs one write.
    wake = events_.empty();
    events_.push_back(event);
  }
  if (wake) Wake();
}

void CallEvents::Wake() {
  const uint64_t one = 1;
  // A full counter (never in practice) still leaves the fd readable, which is all that matters.
  [[maybe_unused]] const ssize_t written = ::write(fd_, &one, sizeof(one));
}

void CallEvents::ClearWakeup() {
  uint64_t count = 0;
  [[maybe_unused]] const ssize_t got = ::read(fd_, &count, sizeof(count));
}

std::vector<CallEvent> CallEvents::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CallEvent> taken;
  taken.swap(events_);
  return taken;
}

ServerCall::ServerCall(CallEvent id, std::string peer,
                       std::optional<std::chrono::steady_clock::time_point> deadline,
                       CallEvents& events)
    : id_(id), peer_(std::move(peer)), deadline_(deadline), events_(events) {}

bool ServerCall::Write(std::string message) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    drained_.wait(lock,
                  [&] { return cancelled_.load() || out_.size() - out_pos_ < kMaxQueuedBytes; });
    if (cancelled_.load() || finished_) return false;
    if (out_pos_ == out_.size()) {
      out_.clear();
      out_pos_ = 0;
    } else if (out_pos_ >= kCompactAfterBytes) {
      out_.erase(0, out_pos_);
      out_pos_ = 0;
    }
    out_ += FrameMessage(message);
  }
  events_.Post(id_);
  return true;
}

void ServerCall::Answer(const std::string& message, GrpcStatus status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    // Even when cancelled: a server that stops cancels its calls and still delivers what they
    // answer, and a stream the client reset drops it anyway.
    if (status.ok()) out_ += FrameMessage(message);
    finished_ = true;
    status_ = std::move(status);
  }
  events_.Post(id_);
}

void ServerCall::Finish(GrpcStatus status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    status_ = std::move(status);
  }
  events_.Post(id_);
}

void ServerCall::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.store(true);
  }
  drained_.notify_all();
}

size_t ServerCall::TakeOutput(uint8_t* out, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = std::min(size, out_.size() - out_pos_);
  std::memcpy(out, out_.data() + out_pos_, n);
  out_pos_ += n;
  if (n > 0) drained_.notify_all();
  return n;
}

std::optional<GrpcStatus> ServerCall::StatusIfDrained() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_ || out_pos_ != out_.size()) return std::nullopt;
  return status_;
}

bool ServerCall::HasOutput() {
  std::lock_guard<std::mutex> lock(mu_);
  return out_pos_ != out_.size();
}

}  // namespace vfio_dra::plugin
