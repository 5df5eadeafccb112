// The store of PrepareCheckpoint: one claim's record read, written and removed (durably)
// (Load and the moving aside of unusable records are in checkpoint_load.cc, the version-1 upgrade
// in checkpoint_upgrade.cc).
#include "prepare/prepare_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "base/file_io.h"
#include "base/k8s_names.h"

namespace vfio_dra::prepare {
namespace {

using nlohmann::json;

constexpr size_t kMaxRecordBytes = 4 << 20;

}  // namespace

Result<PrepareCheckpoint> PrepareCheckpoint::Open(const std::string& data_dir, std::string boot_id,
                                                  DiskSync sync) {
  const std::string dir = data_dir + "/" + kClaimsDirectory;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return MakeError(ErrorKind::kUnavailable, "cannot create the prepare checkpoint directory " +
                                                  dir + ": " + ErrnoText(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "the prepare checkpoint directory " + dir + " is not a directory");
  }
  return PrepareCheckpoint(data_dir, dir, std::move(boot_id), std::move(sync));
}

std::string PrepareCheckpoint::PathOf(const std::string& uid) const {
  return dir_ + "/" + uid + kRecordFileSuffix;
}

Result<std::optional<ClaimRecord>> PrepareCheckpoint::Find(const std::string& uid) const {
  auto record = Read(uid);
  if (!record.ok()) return record.error();
  if (*record == nullptr) return std::optional<ClaimRecord>();
  return std::optional<ClaimRecord>(**record);
}

Result<std::shared_ptr<const ClaimRecord>> PrepareCheckpoint::Read(const std::string& uid,
                                                                   int dir_fd,
                                                                   FileRead* file) const {
  using Shared = std::shared_ptr<const ClaimRecord>;
  if (!IsObjectUid(uid)) return Shared();
  const std::string path = PathOf(uid);
  // Stat'ed and read through one descriptor: the version a caller may act on (move a corrupt
  // record aside) is the version of what was read.
  const int fd = dir_fd >= 0
                     ? ::openat(dir_fd, (uid + kRecordFileSuffix).c_str(), O_RDONLY | O_CLOEXEC)
                     : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      std::lock_guard<std::mutex> lock(parsed_->mu);
      parsed_->by_uid.erase(uid);
      return Shared();
    }
    return MakeError(ErrorKind::kUnavailable,
                     "cannot read the prepare checkpoint record of claim "
                     "uid " +
                         uid + ": " + path + ": " + ErrnoText(errno));
  }
  std::unique_ptr<int, void (*)(int*)> open_file(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot read the prepare checkpoint record of claim uid " + uid + ": " + path +
                         ": " + ErrnoText(errno));
  }
  const FileVersion version = FileVersion::Of(st);
  if (file != nullptr) *file = FileRead{version, st.st_size == 0};
  // Only a power loss leaves an empty record (every write renames a complete file into place):
  // the file's data had not reached the disk, and the reboot undid whatever the record said was
  // done. It counts as none.
  if (st.st_size == 0) return Shared();
  {
    std::lock_guard<std::mutex> lock(parsed_->mu);
    auto it = parsed_->by_uid.find(uid);
    if (it != parsed_->by_uid.end() && it->second.first == version) {
      return it->second.second;
    }
  }
  auto text = ReadOpenFileToString(fd, path, kMaxRecordBytes);
  if (!text.ok()) {
    return text.error().Wrap("cannot read the prepare checkpoint record of claim uid " + uid);
  }
  try {
    const json root = json::parse(*text);
    if (auto v = root.find("version");
        v != root.end() && v->is_number_integer() && v->get<int>() > kCheckpointVersion) {
      // Written by a newer vfio-dra (the other instance of a rolling update, or before a
      // downgrade): it may record work this build cannot undo, so it is neither used nor moved
      // aside; the newer instance handles the claim.
      return MakeError(ErrorKind::kUnavailable,
                       "the prepare checkpoint record " + path + " has version " +
                           std::to_string(v->get<int>()) +
                           ", written by a newer vfio-dra (this "
                           "build reads version " +
                           std::to_string(kCheckpointVersion) +
                           "); it is kept for the newer version to handle");
    }
    auto record = std::make_shared<const ClaimRecord>(RecordFromJson(root));
    if (record->uid != uid) {
      throw json::other_error::create(503, "it names claim uid " + record->uid, nullptr);
    }
    std::lock_guard<std::mutex> lock(parsed_->mu);
    parsed_->by_uid[uid] = {version, record};
    return Shared(std::move(record));
  } catch (const json::exception& e) {
    return MakeError(ErrorKind::kDataLoss,
                     "the prepare checkpoint record " + path + " is unusable: " + e.what());
  }
}

Result<std::optional<FileLock>> PrepareCheckpoint::LockRecords(LockMode mode) const {
  const std::string path = data_dir_ + "/" + kRecordsLockFile;
  if (mode == LockMode::kExclusive) return FileLock::TryAcquire(path, mode);
  auto held = FileLock::Acquire(path, mode, Deadline::After(kRecordsLockWait),
                                "the prepare checkpoint's records lock " + path);
  if (!held.ok()) return held.error();
  return std::optional<FileLock>(std::move(*held));
}

Result<std::shared_ptr<const ClaimRecord>> PrepareCheckpoint::Put(ClaimRecord record) const {
  if (!IsObjectUid(record.uid)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "cannot record claim uid \"" + record.uid + "\": not an object UID");
  }
  record.boot_id = boot_id_;
  const std::string path = PathOf(record.uid);
  auto text = RecordText(record);
  if (!text.ok()) return text.error().Wrap("cannot write the prepare checkpoint");
  auto records_lock = LockRecords(LockMode::kShared);
  if (!records_lock.ok()) return records_lock.error().Wrap("cannot write the prepare checkpoint");
  // Not forced to disk: what a power loss can leave of it is handled at the restart (see the
  // header), and a prepare pays no fsync.
  Status status = WriteFileAtomically(path, *text, 0600, Durability::kVolatile, sync_);
  if (!status.ok()) return status.error().Wrap("cannot write the prepare checkpoint");
  auto written = std::make_shared<const ClaimRecord>(std::move(record));
  // What was written needs no parsing when the next Load meets it. A claim's record is written
  // only by the holder of its devices' locks, so the file now at `path` is this one; if it is
  // replaced later, its version differs and it is parsed then.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    std::lock_guard<std::mutex> lock(parsed_->mu);
    parsed_->by_uid[written->uid] = {FileVersion::Of(st), written};
  }
  return written;
}

Status PrepareCheckpoint::Remove(const std::string& uid) const {
  if (!IsObjectUid(uid)) return Status::Ok();
  {
    auto records_lock = LockRecords(LockMode::kShared);
    if (!records_lock.ok()) {
      return records_lock.error().Wrap("cannot remove the prepare checkpoint record of claim uid " +
                                       uid);
    }
    // The record's leftover temporary files go too: a process killed while writing it leaves one.
    if (Status s = RemoveFileAndTemporaries(PathOf(uid)); !s.ok()) {
      return s.error().Wrap("cannot remove the prepare checkpoint record of claim uid " + uid);
    }
  }
  // The one write made durable: a removal a power loss undid would bring back a record holding
  // devices for a claim the kubelet has forgotten, and nobody would unprepare it.
  return dir_sync_->Sync();
}

Result<std::string> ReadBootId(const std::string& path) {
  auto text = ReadFileToString(path, 4096);
  if (!text.ok()) return text.error().Wrap("cannot read the boot ID");
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace vfio_dra::prepare