#include "base/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "base/file_io.h"

namespace vfio_dra {
namespace {

int FlockOperation(LockMode mode) { return mode == LockMode::kShared ? LOCK_SH : LOCK_EX; }

Result<int> OpenLockFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot open lock file " + path + ": " + ErrnoText(errno));
  }
  return fd;
}

}  // namespace

Error LockWaitExpired(const std::string& what, std::chrono::steady_clock::time_point since) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - since);
  return MakeError(ErrorKind::kDeadlineExceeded,
                   "waited " + std::to_string(waited.count()) + " ms for " + what +
                       ", and the caller's deadline passed: that work is still running (a device "
                       "busy in the kernel holds it up); the kubelet retries");
}

Status FlockUntil(int fd, LockMode mode, Deadline deadline, const std::string& what) {
  // The holder keeps a lock for one claim's device work, so a bounded wait polls, backing off
  // from 1 ms to 25 ms.
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    const int operation = FlockOperation(mode) | (deadline.IsSet() ? LOCK_NB : 0);
    if (::flock(fd, operation) == 0) return Status::Ok();
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK) {
      return MakeError(ErrorKind::kUnavailable, "cannot lock " + what + ": " + ErrnoText(err));
    }
    if (deadline.Expired()) return LockWaitExpired(what, start);
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        pause, deadline.at() - std::chrono::steady_clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(25));
  }
}

Result<FileLock> FileLock::Acquire(const std::string& path, LockMode mode, Deadline deadline,
                                   const std::string& what) {
  auto fd = OpenLockFile(path);
  if (!fd.ok()) return fd.error();
  FileLock lock(*fd);
  if (Status s = FlockUntil(*fd, mode, deadline, what); !s.ok()) return s.error();
  return lock;
}

Result<std::optional<FileLock>> FileLock::TryAcquire(const std::string& path, LockMode mode) {
  auto fd = OpenLockFile(path);
  if (!fd.ok()) return fd.error();
  FileLock lock(*fd);
  for (;;) {
    if (::flock(*fd, FlockOperation(mode) | LOCK_NB) == 0) {
      return std::optional<FileLock>(std::move(lock));
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EWOULDBLOCK) return std::optional<FileLock>();
    return MakeError(ErrorKind::kUnavailable, "cannot lock " + path + ": " + ErrnoText(err));
  }
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  // Closing the last descriptor of the open file description releases the flock.
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace vfio_dra
