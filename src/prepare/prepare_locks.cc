#include "prepare/prepare_locks.h"

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {

Result<PrepareLocks> PrepareLocks::Open(const std::string& data_dir) {
  if (Status s = EnsureDirectory(data_dir + "/" + kDeviceLockDirectory); !s.ok()) {
    return s.error().Wrap("cannot set up the device locks");
  }
  return PrepareLocks(data_dir);
}

Result<FileLock> PrepareLocks::Call(Deadline deadline) const {
  const std::string path = data_dir_ + "/" + kSerializeLockFile;
  return FileLock::Acquire(path, LockMode::kShared, deadline,
                           "the node lock " + path +
                               " (an instance of an older version holds it "
                               "for each of its calls)");
}

Result<FileLock> PrepareLocks::Decision(Deadline deadline) const {
  const std::string path = data_dir_ + "/" + kDecisionLockFile;
  return FileLock::Acquire(path, LockMode::kShared, deadline,
                           "the prepare lock " + path + " (held by start-up recovery)");
}

Result<FileLock> PrepareLocks::Recovery(Deadline deadline) const {
  const std::string path = data_dir_ + "/" + kDecisionLockFile;
  return FileLock::Acquire(path, LockMode::kExclusive, deadline,
                           "the prepare lock " + path + " (calls deciding what to do)");
}

Result<std::string> PrepareLocks::DevicePath(const std::string& address) const {
  // The address becomes a file name: only a PCI address may, in one spelling.
  auto canonical = sysfs::CanonicalBdf(address);
  if (!canonical.ok()) {
    return canonical.error().Wrap("cannot lock device \"" + address + "\"");
  }
  return data_dir_ + "/" + kDeviceLockDirectory + "/" + *canonical + ".lock";
}

Result<bool> DeviceLockSet::TryAdd(const std::set<std::string>& addresses, std::string& busy) {
  for (const std::string& address : addresses) {
    // Keyed by the lock file, so two spellings of one address are one lock, not a self-conflict.
    auto path = locks_->DevicePath(address);
    if (!path.ok()) return path.error();
    if (held_.count(*path) != 0) continue;
    auto lock = FileLock::TryAcquire(*path, LockMode::kExclusive);
    if (!lock.ok()) return lock.error();
    if (!lock->has_value()) {
      busy = address;
      return false;
    }
    held_.emplace(*path, std::move(**lock));
  }
  return true;
}

Status PrepareLocks::AwaitDevice(const std::string& address, Deadline deadline) const {
  auto path = DevicePath(address);
  if (!path.ok()) return path.error();
  auto lock = FileLock::Acquire(*path, LockMode::kExclusive, deadline,
                                "device " + address + ", which another claim's call is changing");
  if (!lock.ok()) return lock.error();
  return Status::Ok();
}

}  // namespace vfio_dra::prepare
