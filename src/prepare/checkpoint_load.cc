// PrepareCheckpoint::Load: every record, from the index the directory's change events keep
// current (or a full listing), and the records that cannot be used: an empty one (a power loss
// before its data reached the disk) dropped, a corrupt one moved aside, each only while its file
// is still the version that was read.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "base/file_io.h"
#include "base/k8s_names.h"
#include "prepare/checkpoint_aside.h"
#include "prepare/prepare_checkpoint.h"

namespace vfio_dra::prepare {
namespace {

// The claim uid a file name in the directory is the record of, if any (not temporary files).
std::optional<std::string> UidOfRecordFile(const std::string& name) {
  if (name.size() <= 5 || name.compare(name.size() - 5, 5, kRecordFileSuffix) != 0) {
    return std::nullopt;
  }
  std::string uid = name.substr(0, name.size() - 5);
  if (!IsObjectUid(uid)) return std::nullopt;
  return uid;
}

}  // namespace

Result<std::optional<std::string>> PrepareCheckpoint::Retire(const std::string& uid,
                                                             const FileVersion& version,
                                                             bool keep_copy) const {
  using Outcome = std::optional<std::string>;
  auto held = LockRecords(LockMode::kExclusive);
  if (!held.ok()) return held.error();
  if (!*held) return Outcome();  // a write is landing: it may be this very record
  const std::string path = PathOf(uid);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Outcome();
    return MakeError(ErrorKind::kUnavailable, "cannot stat it: " + ErrnoText(errno));
  }
  if (!(FileVersion::Of(st) == version)) return Outcome();  // replaced since it was read
  if (!keep_copy) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return MakeError(ErrorKind::kUnavailable, "cannot unlink it: " + ErrnoText(errno));
    }
    return Outcome(std::string());
  }
  auto aside = MoveToUniqueAside(path);
  if (!aside.ok()) return aside.error();
  return Outcome(std::move(*aside));
}

void PrepareCheckpoint::LoadRecord(RecordIndex& index, const std::string& uid, int dir_fd,
                                   CheckpointView& view) const {
  index.records.erase(uid);
  index.retry.erase(uid);
  FileRead file;
  auto record = Read(uid, dir_fd, &file);
  const std::string path = PathOf(uid);
  if (record.ok() && *record == nullptr && file.empty) {
    auto dropped = Retire(uid, file.version, /*keep_copy=*/false);
    if (dropped.ok() && dropped->has_value()) {
      view.problems.push_back("removed the empty prepare checkpoint record " + path +
                              ": a power loss came before its data reached the disk, and the "
                              "reboot after it undid whatever that prepare had done");
    } else {
      // Replaced meanwhile, or a write is landing: read again at the next Load.
      index.retry.insert(uid);
      if (!dropped.ok()) {
        view.problems.push_back("cannot remove the empty prepare checkpoint record " + path + ": " +
                                dropped.error().message);
      }
    }
    return;
  }
  if (record.ok()) {
    if (*record) index.records.emplace(uid, std::move(*record));
    return;
  }
  index.retry.insert(uid);
  if (record.error().kind == ErrorKind::kDataLoss) {
    const std::string consequence =
        "the claim's devices cannot be undone automatically, check them by hand";
    auto moved = Retire(uid, file.version, /*keep_copy=*/true);
    if (moved.ok() && moved->has_value()) {
      index.retry.erase(uid);
      view.problems.push_back(UnusableText(path, record.error().message, **moved, consequence));
      return;
    }
    // Not moved (it changed since it was read, a write is landing, or the move failed): it
    // still may hold any device, so it is reported as unreadable until it is read again.
    view.unreadable[uid] = record.error().message;
    if (!moved.ok()) {
      view.problems.push_back(
          UnusableText(path, record.error().message, moved.error(), consequence));
    }
    return;
  }
  view.unreadable[uid] = record.error().message;
  view.problems.push_back(record.error().message +
                          "; the claim is kept and retried on its next prepare or unprepare");
}

CheckpointView PrepareCheckpoint::Load() const {
  CheckpointView view;
  RecordIndex& index = *index_;
  std::lock_guard<std::mutex> lock(index.mu);
  // Taken before anything is read: a change made while this Load reads is read again by the next.
  DirectoryChanges::Batch changed = index.changes.Take();
  if (!changed.everything && index.complete) {
    // The batch is gone from the kernel's queue: until every record it names is read, the index
    // is not to be trusted (an exception on the way leaves the next Load to read everything).
    index.complete = false;
    std::set<std::string> uids = index.retry;
    for (const std::string& name : changed.names) {
      if (auto uid = UidOfRecordFile(name)) uids.insert(std::move(*uid));
    }
    for (const std::string& uid : uids) LoadRecord(index, uid, -1, view);
    index.complete = true;
    view.claims = index.records;
    return view;
  }
  index.complete = false;
  index.records.clear();
  index.retry.clear();
  DIR* dir = ::opendir(dir_.c_str());
  if (dir == nullptr) {
    view.listing_error =
        "cannot list the prepare checkpoint directory " + dir_ + ": " + ErrnoText(errno);
    view.problems.push_back(*view.listing_error);
    return view;
  }
  // Open until the records are read: they are looked up relative to it.
  std::unique_ptr<DIR, int (*)(DIR*)> open_dir(dir, &::closedir);
  std::vector<std::string> uids;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) break;
    if (auto uid = UidOfRecordFile(entry->d_name)) uids.push_back(std::move(*uid));
  }
  if (errno != 0) {
    // A listing cut short would leave records out of the index until they are written again.
    view.listing_error =
        "cannot list the prepare checkpoint directory " + dir_ + ": " + ErrnoText(errno);
    view.problems.push_back(*view.listing_error);
    return view;
  }
  for (const std::string& uid : uids) LoadRecord(index, uid, ::dirfd(dir), view);
  index.complete = true;
  view.claims = index.records;
  return view;
}

}  // namespace vfio_dra::prepare
