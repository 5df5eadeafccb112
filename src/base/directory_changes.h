// DirectoryChanges: which entries of one directory were created, renamed, removed, or written and
// closed since the last Take, by any process, from an inotify watch. A reader that keeps an index
// of the directory re-reads only those entries instead of listing and stat'ing every one each
// time.
// Invariants:
// - A change whose system call returned before Take() began (for a write, the close that ends
//   it) is in what that Take, or an earlier one, reports: the kernel queues the event inside the
//   call that makes the change. A caller that takes a lock the writer released after its change
//   therefore sees it.
// - Whenever the changes cannot be known, Take says `everything` and the caller must read the
//   whole directory again: the first Take; no watch (inotify unavailable or out of instances, the
//   directory missing); the path naming another directory than the one watched (it, or one
//   above it, removed, renamed or mounted over); the kernel's event queue overflowed; a read of
//   the events failed. The watch is set again at the next Take.
// - Not reported: changes that end no write and move no name (a truncate(2) by path, a chmod, a
//   write whose file is still open). The readers here replace files whole, by rename.
// - Not thread-safe: one caller at a time (the owner's lock).
#pragma once

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>

namespace vfio_dra {

class DirectoryChanges {
 public:
  // Watches `directory`. Never fails: without a watch every Take says `everything`, and
  // unwatched() says why.
  explicit DirectoryChanges(std::string directory);
  ~DirectoryChanges();
  DirectoryChanges(const DirectoryChanges&) = delete;
  DirectoryChanges& operator=(const DirectoryChanges&) = delete;

  struct Batch {
    bool everything = false;      // the changes are unknown: read the whole directory
    std::set<std::string> names;  // the entries that changed (empty when `everything`)
  };
  Batch Take();

  // Why the directory is not watched now (every Take then says `everything`), or nothing.
  const std::optional<std::string>& unwatched() const { return unwatched_; }
  const std::string& directory() const { return directory_; }

 private:
  void Watch();

  const std::string directory_;
  int fd_ = -1;               // the inotify instance
  int wd_ = -1;               // the watch of directory_ in it; -1 when there is none
  dev_t watched_device_ = 0;  // what directory_ was when it was watched
  ino_t watched_inode_ = 0;
  bool first_ = true;
  std::optional<std::string> unwatched_;
};

}  // namespace vfio_dra
