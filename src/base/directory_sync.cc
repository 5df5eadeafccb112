#include "base/directory_sync.h"

#include <algorithm>

#include "base/file_io.h"

namespace vfio_dra {

GroupDirectorySync::GroupDirectorySync(std::string directory, SyncFunction sync)
    : directory_(std::move(directory)),
      sync_(sync ? std::move(sync) : [](const std::string& dir) { return SyncDirectory(dir); }) {}

Status GroupDirectorySync::Sync() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t ticket = ++tickets_;
  while (synced_to_ < ticket) {
    if (running_) {
      // The fsync in flight may have begun before this caller's rename: wait, then look again.
      done_.wait(lock);
      continue;
    }
    running_ = true;
    const uint64_t covers = tickets_;
    ++fsyncs_;
    lock.unlock();
    Status status = sync_(directory_);
    lock.lock();
    running_ = false;
    if (status.ok()) synced_to_ = std::max(synced_to_, covers);
    // Woken after the unlock, the waiters find the mutex free instead of blocking on it at once.
    lock.unlock();
    done_.notify_all();
    if (!status.ok()) return status;
    lock.lock();
  }
  return Status::Ok();
}

uint64_t GroupDirectorySync::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tickets_;
}

uint64_t GroupDirectorySync::fsyncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fsyncs_;
}

}  // namespace vfio_dra
