// FileLock: an flock(2) on a file of its own open file description, held while the object lives
// and released by the kernel if the process dies, which is what makes it usable between the two
// daemon instances of a rolling update and between threads of one process alike (each holder
// opens the file itself, so two threads conflict exactly as two processes do).
// Invariant: a FileLock that exists holds its lock; a wait is bounded by the caller's deadline,
// and an flock failure other than "held by someone else" is an error, never a lock assumed.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "base/deadline.h"
#include "base/result.h"

namespace vfio_dra {

enum class LockMode { kShared, kExclusive };

class FileLock {
 public:
  // Waits for the lock until `deadline` (kDeadlineExceeded saying how long it waited for what);
  // `what` describes the lock for messages ("the node lock <path>").
  static Result<FileLock> Acquire(const std::string& path, LockMode mode, Deadline deadline,
                                  const std::string& what);
  // Takes the lock if it is free now; nullopt when another holder has it.
  static Result<std::optional<FileLock>> TryAcquire(const std::string& path, LockMode mode);

  FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

// The error of a lock wait that reached the caller's deadline: how long it waited, for what.
Error LockWaitExpired(const std::string& what, std::chrono::steady_clock::time_point since);

// Locks an already open file description, polling until `deadline` (flock has no timeout);
// used where one descriptor is kept open for the process's lifetime.
Status FlockUntil(int fd, LockMode mode, Deadline deadline, const std::string& what);

}  // namespace vfio_dra
