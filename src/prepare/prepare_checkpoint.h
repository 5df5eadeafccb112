// PrepareCheckpoint: what the daemon did to the node for each claim, kept on disk so that any
// prepare can be finished or undone after a crash, a reboot, or by the other instance of a rolling
// update. Each claim has its own file, <plugin-data-dir>/claims/<uid>.json, replaced atomically
// (temp file, rename) with mode 0600, so an instance only ever writes the claim it works on and
// never a stale copy of another's.
//
// Invariants:
// - A record is written without fsync; only its removal is made durable (an fsync of the
//   directory, shared by the removals that finish together). A process crash loses nothing
//   written: the page cache outlives the process. Only a power loss or a kernel crash loses an
//   unsynced write, and either reboots the node, which undoes all a record describes (bindings,
//   driver_override, mdevs, vGPU types, VF settings, /var/run/cdi). The record that loss leaves
//   (none, an empty or cut-short file, or an earlier write of it) is one a restart already
//   handles: none or empty is a claim never prepared (start-up recovery removes the files no
//   record owns), one cut short is moved aside, PrepareStarted of an earlier boot is rolled back,
//   PrepareCompleted of an earlier boot is prepared again or undone by the kubelet. A removal
//   that came back would not be: it would hold devices for a claim nobody will unprepare.
// - Callers Load() under the node-wide lock every time they act, so two instances serving calls
//   at once see each other's work. Load keeps an index of the records that the directory's
//   change events (inotify) keep current, so it reads only the records written or removed since
//   the Load before, by either instance; without events it reads every record, as it does after
//   an event queue overflow.
// - A claim goes through two phases. PrepareStarted is written before anything on the node is
//   touched and holds everything needed to undo it (each function's original driver,
//   driver_override and identity, the mdevs to create, the plan of every device); it becomes
//   PrepareCompleted with the answer given to the kubelet.
// - Each record carries the boot ID it was written in: after a reboot, PCI addresses may name
//   other devices, so functions are checked against the recorded identity before being touched.
// - A record that is corrupt is moved aside with a clear problem, under a name no earlier move
//   used; one that cannot be read (EACCES, EIO) or is of a newer version is reported and left in
//   place, and its claim stays unpreparable-with-an-error instead of silently forgotten. Neither
//   stops the daemon: refusing to start would leave every pod on the node unable to unprepare.
// - Any caller may Load, holding none of a claim's locks, while the claim's owner replaces its
//   record. So a record is moved aside (or an empty one dropped) only if the file at its path is
//   still the very one that was read, checked and moved under <plugin-data-dir>/records.lock held
//   exclusively; every write, removal and upgrade of a record holds that lock shared for the
//   moment it changes the directory. A record that cannot be moved now is reported unreadable and
//   read again by the next Load.
// - Version 1 (one checkpoint.json for all claims) is upgraded explicitly by Upgrade().
//
// The record itself is in claim_record.h, its file format in checkpoint_record_json.h. Reading and
// writing one record is prepare_checkpoint.cc, Load and moving unusable records aside
// checkpoint_load.cc, the version-1 upgrade checkpoint_upgrade.cc.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/directory_changes.h"
#include "base/directory_sync.h"
#include "base/file_io.h"
#include "base/file_lock.h"
#include "base/result.h"
#include "prepare/checkpoint_record_json.h"
#include "prepare/claim_record.h"

namespace vfio_dra::prepare {

inline constexpr const char* kClaimsDirectory = "claims";
// In the plugin data dir: held shared by every change of a record, exclusively to move one aside.
inline constexpr const char* kRecordsLockFile = "records.lock";
// The version-1 file (all claims in one), read only to upgrade it.
inline constexpr const char* kLegacyCheckpointFile = "checkpoint.json";
// A claim's record is <uid> with this suffix in the claims directory.
inline constexpr const char* kRecordFileSuffix = ".json";

class PrepareCheckpoint {
 public:
  // Creates <data_dir>/claims if needed. Nothing is read yet. Every fsync the checkpoint runs
  // goes through `sync` (tests count them).
  static Result<PrepareCheckpoint> Open(const std::string& data_dir, std::string boot_id,
                                        DiskSync sync = {});

  const std::string& boot_id() const { return boot_id_; }
  const std::string& directory() const { return dir_; }

  // Every record. Call under the node-wide lock before acting on what it says. Records that
  // changed since the last Load (by the directory's change events) are stat'ed, and parsed when
  // their file is not the version last parsed or written here (same inode, size and timestamps).
  CheckpointView Load() const;
  // Why Load cannot follow the directory's changes and reads every record each time, or nothing.
  std::optional<std::string> unwatched() const {
    std::lock_guard<std::mutex> lock(index_->mu);
    return index_->changes.unwatched();
  }
  // Reads one claim's record: nullopt when there is none; an error when it cannot be read.
  Result<std::optional<ClaimRecord>> Find(const std::string& uid) const;
  // Replaces a claim's record (stamped with this boot's ID) atomically, visible to every reader
  // when it returns and not forced to disk (see the first invariant), and returns the record as
  // written (shared with later Loads, so callers keep it without a copy).
  Result<std::shared_ptr<const ClaimRecord>> Put(ClaimRecord record) const;
  // Drops a claim's record durably; dropping an unknown claim succeeds. Removals that finish
  // together share the fsync of the directory (group commit).
  Status Remove(const std::string& uid) const;

  // Splits a version-1 checkpoint.json into per-claim records and removes it. Call under the
  // node-wide lock. Returns the number of claims moved; a corrupt file is moved aside and
  // reported through `problem`.
  Result<int> Upgrade(std::string* problem) const;

 private:
  PrepareCheckpoint(std::string data_dir, std::string dir, std::string boot_id, DiskSync sync)
      : data_dir_(std::move(data_dir)),
        dir_(std::move(dir)),
        boot_id_(std::move(boot_id)),
        sync_(std::move(sync)),
        dir_sync_(std::make_shared<GroupDirectorySync>(
            dir_, [sync = sync_](const std::string& d) { return sync.Directory(d); })),
        parsed_(std::make_shared<ParsedRecords>()),
        index_(std::make_shared<RecordIndex>(dir_)) {}
  std::string PathOf(const std::string& uid) const;
  // What identifies one version of a record file: an atomic replacement is a new inode.
  struct FileVersion;
  // The file a Read read: its version, and whether it was empty.
  struct FileRead;
  // Find, with the version of the file read (also of a corrupt or empty one) in `file`.
  // Null when the claim has no record or its file is empty (see Put). `dir_fd`, when not -1, is
  // the checkpoint directory open: the record is looked up relative to it (Load reads every
  // record, and a lookup from the root walks the whole path each time).
  Result<std::shared_ptr<const ClaimRecord>> Read(const std::string& uid, int dir_fd = -1,
                                                  FileRead* file = nullptr) const;
  // kShared waits (a mover holds it for a moment), kExclusive only tries (nullopt: busy).
  Result<std::optional<FileLock>> LockRecords(LockMode mode) const;
  // Moves the claim's record aside (`keep_copy`; returns its new name) or drops it (returns ""),
  // if the file at its path is still `version`. nullopt when it was not: the file changed since,
  // or a write holds the records lock now; the caller reads it again later.
  Result<std::optional<std::string>> Retire(const std::string& uid, const FileVersion& version,
                                            bool keep_copy) const;
  static constexpr std::chrono::seconds kRecordsLockWait{10};

  struct FileVersion {
    uint64_t device = 0, inode = 0, size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    static FileVersion Of(const struct stat& st) {
      return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
              static_cast<uint64_t>(st.st_size),
              st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
              st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec};
    }
    bool operator==(const FileVersion&) const = default;
  };
  struct FileRead {
    FileVersion version;
    bool empty = false;
  };
  struct ParsedRecords {
    std::mutex mu;
    std::map<std::string, std::pair<FileVersion, std::shared_ptr<const ClaimRecord>>> by_uid;
  };

  // The records as of the last Load. Every change to the directory after that Load is in the
  // next Take of `changes`, so the records it does not name are still current.
  struct RecordIndex {
    explicit RecordIndex(const std::string& dir) : changes(dir) {}
    std::mutex mu;  // serializes Loads
    DirectoryChanges changes;
    bool complete = false;  // `records` holds every record (not after a failed listing)
    std::map<std::string, std::shared_ptr<const ClaimRecord>> records;
    std::set<std::string> retry;  // records that could not be read: read again at every Load
  };
  // Reads `uid` into the index, and what went wrong into `view`.
  void LoadRecord(RecordIndex& index, const std::string& uid, int dir_fd,
                  CheckpointView& view) const;

  std::string data_dir_;
  std::string dir_;
  std::string boot_id_;
  DiskSync sync_;
  std::shared_ptr<GroupDirectorySync> dir_sync_;
  std::shared_ptr<ParsedRecords> parsed_;  // a cache of parsing only: each use stats the file
  std::shared_ptr<RecordIndex> index_;
};

// The kernel's boot ID (from /proc/sys/kernel/random/boot_id, or `path` for tests).
Result<std::string> ReadBootId(const std::string& path = "/proc/sys/kernel/random/boot_id");

}  // namespace vfio_dra::prepare
