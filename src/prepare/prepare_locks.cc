#include "prepare/prepare_locks.h"

#include <algorithm>
#include <cctype>

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
  // The address becomes a file name: a PCI address in one spelling, or the name of a parent
  // device that is not on PCI (the mtty sample's "mtty"), which sysfs gives as one safe name.
  if (auto canonical = sysfs::CanonicalBdf(address); canonical.ok()) {
    return data_dir_ + "/" + kDeviceLockDirectory + "/" + *canonical + ".lock";
  }
  const bool safe = !address.empty() && address.size() <= 128 && address[0] != '.' &&
                    std::all_of(address.begin(), address.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' ||
                             c == '_' || c == '.' || c == ':';
                    });
  if (!safe) {
    return MakeError(
        ErrorKind::kInvalidArgument,
        "cannot lock device \"" + address + "\": neither a PCI address nor a plain device name");
  }
  return data_dir_ + "/" + kDeviceLockDirectory + "/parent-" + address + ".lock";
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
