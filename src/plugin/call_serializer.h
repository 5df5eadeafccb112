// CallSerializer: makes device work for different claims run one at a time, within this process
// (a mutex) and across the two daemon instances that overlap during a rolling update (an exclusive
// flock on <plugin-data-dir>/serialize.lock, the same file name the upstream helper uses).
// Invariant: a Guard exists only while both are held; a wait for the lock is bounded by the
// caller's deadline, and a flock failure is an error, never work done without the lock.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "base/deadline.h"
#include "base/result.h"

namespace vfio_dra::plugin {

class CallSerializer {
 public:
  // Opens (creating if needed) the lock file; fails with a message naming it.
  static Result<std::unique_ptr<CallSerializer>> Open(const std::string& lock_file);
  ~CallSerializer();
  CallSerializer(const CallSerializer&) = delete;
  CallSerializer& operator=(const CallSerializer&) = delete;

  // Holds the node-wide lock while it lives.
  class Guard {
   public:
    Guard(Guard&& other) noexcept;
    Guard& operator=(Guard&&) = delete;
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard();

   private:
    friend class CallSerializer;
    explicit Guard(CallSerializer* owner) : owner_(owner) {}
    CallSerializer* owner_;
  };

  // Waits for the lock until `deadline` (kDeadlineExceeded, saying how long it waited). A flock
  // failure other than an interrupted wait is kUnavailable naming the lock file.
  Result<Guard> Acquire(Deadline deadline = {});

 private:
  CallSerializer(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status LockFile(Deadline deadline);
  void Release();
  // A flag under a plain mutex rather than std::timed_mutex: its timed wait is a
  // pthread_mutex_clocklock that ThreadSanitizer does not intercept, which made every bounded
  // wait look like an unlock of an unlocked mutex.
  std::mutex mu_;
  std::condition_variable released_;
  bool busy_ = false;
  int fd_;
  std::string path_;
};

}  // namespace vfio_dra::plugin
