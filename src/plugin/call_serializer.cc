#include "plugin/call_serializer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>

#include "base/file_io.h"
#include "base/file_lock.h"

namespace vfio_dra::plugin {

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
  // against the other instance.
  return FlockUntil(fd_, LockMode::kExclusive, deadline,
                    "the node lock " + path_ + " (shared with the other plugin instance)");
}

Result<CallSerializer::Guard> CallSerializer::Acquire(Deadline deadline) {
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto free = [this] { return !busy_; };
    if (!deadline.IsSet()) {
      released_.wait(lock, free);
    } else if (!released_.wait_until(lock, deadline.at(), free)) {
      return LockWaitExpired("this instance's device work", start);
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

}  // namespace vfio_dra::plugin
