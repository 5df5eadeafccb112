// GroupDirectorySync: makes renames and removals in one directory durable with as few directory
// fsyncs as possible when several threads finish them at once (group commit). A caller renames
// its file in (or unlinks it), then calls Sync(); Sync returns only after an fsync of the
// directory that *started* after the call began, so the caller's change is covered. Threads
// arriving while an fsync runs wait for it and share the next one instead of each queueing
// their own.
// Invariant: Sync() returns Ok only when a directory fsync that began after the call has
// succeeded; a failed fsync is returned to the thread that ran it, and every other waiter it
// covered runs its own attempt, so no waiter is told "durable" on the strength of a failure.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "base/result.h"

namespace vfio_dra {

class GroupDirectorySync {
 public:
  // `sync` makes the directory's entries durable (SyncDirectory; tests pass one they control).
  using SyncFunction = std::function<Status(const std::string& directory)>;
  explicit GroupDirectorySync(std::string directory, SyncFunction sync = nullptr);
  GroupDirectorySync(const GroupDirectorySync&) = delete;
  GroupDirectorySync& operator=(const GroupDirectorySync&) = delete;

  Status Sync();

  const std::string& directory() const { return directory_; }
  // How many Sync calls were made and how many directory fsyncs ran for them (tests and
  // benchmarks compare the two).
  uint64_t requests() const;
  uint64_t fsyncs() const;

 private:
  const std::string directory_;
  const SyncFunction sync_;
  mutable std::mutex mu_;
  std::condition_variable done_;
  uint64_t tickets_ = 0;    // Sync calls so far
  uint64_t synced_to_ = 0;  // every ticket up to this one is durable
  bool running_ = false;
  uint64_t fsyncs_ = 0;
};

}  // namespace vfio_dra
