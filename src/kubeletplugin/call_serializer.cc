#include "kubeletplugin/call_serializer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>

#include "base/file_io.h"

namespace vfio_dra::kubeletplugin {
namespace {

Error LockTimeout(const std::string& what, std::chrono::steady_clock::time_point since) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - since);
  return MakeError(ErrorKind::kDeadlineExceeded,
                   "waited " + std::to_string(waited.count()) + " ms for " + what +
                       " until the caller's deadline: other device work on this node is still "
                       "running (a device busy in the kernel holds it up); the kubelet retries");
}

}  // namespace

Result<std::unique_ptr<CallSerializer>> CallSerializer::Open(const std::string& lock_file) {
  int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot open lock file " + lock_file + ": " + ErrnoText(errno));
  }
  return std::unique_ptr<CallSerializer>(new CallSerializer(fd, lock_file));
}

CallSerializer::~CallSerializer() { ::close(fd_); }

Status CallSerializer::LockFile(Deadline deadline) {
  // flock is per open file description: the mutex orders threads here, the flock orders us
  // against the other instance. flock has no timeout, so a bounded wait polls, backing off from
  // 1 ms to 25 ms (the other instance holds the lock for one claim's device work).
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    const int flags = deadline.IsSet() ? LOCK_EX | LOCK_NB : LOCK_EX;
    if (::flock(fd_, flags) == 0) return Status::Ok();
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      return MakeError(
          ErrorKind::kUnavailable,
          "cannot lock " + path_ + " (shared with the other plugin instance): " + ErrnoText(err));
    }
    if (deadline.Expired()) return LockTimeout("the node lock " + path_, start);
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        pause, deadline.at() - std::chrono::steady_clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(25));
  }
}

Result<CallSerializer::Guard> CallSerializer::Acquire(Deadline deadline) {
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto free = [this] { return !busy_; };
    if (!deadline.IsSet()) {
      released_.wait(lock, free);
    } else if (!released_.wait_until(lock, deadline.at(), free)) {
      return LockTimeout("this instance's device work", start);
    }
    busy_ = true;
  }
  if (Status s = LockFile(deadline); !s.ok()) {
    Release();
    return s.error();
  }
  return Guard(this);
}

void CallSerializer::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
  released_.notify_one();
}

CallSerializer::Guard::Guard(Guard&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}

CallSerializer::Guard::~Guard() {
  if (owner_ == nullptr) return;
  ::flock(owner_->fd_, LOCK_UN);
  owner_->Release();
}

}  // namespace vfio_dra::kubeletplugin
