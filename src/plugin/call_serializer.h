// CallSerializer: makes device work for different claims run one at a time, within this process
// (a mutex) and across the two daemon instances that overlap during a rolling update (an exclusive
// flock on <plugin-data-dir>/serialize.lock, the same file name the upstream helper uses).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "base/result.h"

namespace vfio_dra::plugin {

class CallSerializer {
 public:
  // Opens (creating if needed) the lock file; fails with a message naming it.
  static Result<std::unique_ptr<CallSerializer>> Open(const std::string& lock_file);
  ~CallSerializer();
  CallSerializer(const CallSerializer&) = delete;
  CallSerializer& operator=(const CallSerializer&) = delete;

  class Guard {
   public:
    explicit Guard(CallSerializer& owner);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    CallSerializer& owner_;
    std::unique_lock<std::mutex> lock_;
  };

 private:
  explicit CallSerializer(int fd) : fd_(fd) {}
  std::mutex mu_;
  int fd_;
};

}  // namespace vfio_dra::plugin
