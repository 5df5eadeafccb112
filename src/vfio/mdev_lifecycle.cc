#include "vfio/mdev_lifecycle.h"

#include <cerrno>
#include <filesystem>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::vfio {
namespace {

std::string InstancePath(const std::string& uuid) { return "bus/mdev/devices/" + uuid; }

std::string Describe(const MdevIdentity& mdev) {
  return "mdev " + mdev.uuid + " (type " + mdev.type_id + " on " + mdev.parent + ")";
}

}  // namespace

bool MdevLifecycle::Exists(const std::string& uuid) const {
  return sysfs_.Exists(InstancePath(uuid));
}

Status MdevLifecycle::CheckExisting(const MdevIdentity& mdev) const {
  auto type = sysfs_.LinkBaseName(InstancePath(mdev.uuid) + "/mdev_type");
  auto real = sysfs_.RealPath(InstancePath(mdev.uuid));
  auto parent_real = sysfs_.RealPath("class/mdev_bus/" + mdev.parent);
  if (!type.ok() || !real.ok() || !parent_real.ok()) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     Describe(mdev) + ": an instance with this UUID exists but cannot be read");
  }
  const std::string expected_dir = *parent_real + "/" + mdev.uuid;
  if (*type != mdev.type_id || *real != expected_dir) {
    return MakeError(ErrorKind::kAlreadyExists,
                     Describe(mdev) + ": the UUID is taken by an instance of type " + *type +
                         " at " + sysfs_.Path(*real) + "; remove it or fix the node's mdev setup");
  }
  return Status::Ok();
}

Status MdevLifecycle::NoCapacity(const MdevIdentity& mdev, const std::string& why) const {
  // What runs on the parent tells the admin whether this is a full parent or the one-type rule.
  const std::string types_dir = "class/mdev_bus/" + mdev.parent + "/mdev_supported_types";
  std::string in_use;
  std::string other_type;
  if (auto types = sysfs_.List(types_dir); types.ok()) {
    for (const std::string& type : *types) {
      auto devices = sysfs_.List(types_dir + "/" + type + "/devices");
      if (!devices.ok() || devices->empty()) continue;
      in_use += (in_use.empty() ? "" : ", ") + type + " (" + std::to_string(devices->size()) +
                (devices->size() == 1 ? " instance)" : " instances)");
      if (type != mdev.type_id) other_type = type;
    }
  }
  std::string message = Describe(mdev) + ": no capacity left on the parent (" + why + ")";
  if (in_use.empty()) return MakeError(ErrorKind::kFailedPrecondition, message);
  message += "; in use on " + mdev.parent + ": " + in_use;
  if (!other_type.empty()) {
    message += ". If this parent runs one type at a time, pin one type for it in the policy (" +
               std::string("select: [{kind: mdev, address: \"") + mdev.parent + "\", mdevType: \"" +
               other_type +
               "\"}]) so that only that type is offered; the kubelet retries this claim on this "
               "node until an instance of " +
               other_type + " is removed or the claim is deleted";
  }
  return MakeError(ErrorKind::kFailedPrecondition, message);
}

Status MdevLifecycle::Create(const MdevIdentity& mdev) {
  if (Exists(mdev.uuid)) {
    return CheckExisting(mdev);
  }
  const std::string type_dir =
      "class/mdev_bus/" + mdev.parent + "/mdev_supported_types/" + mdev.type_id;
  if (!sysfs_.IsDirectory(type_dir)) {
    return MakeError(ErrorKind::kNotFound, Describe(mdev) +
                                               ": the parent no longer offers the type (no " +
                                               sysfs_.Path(type_dir) + ")");
  }
  if (auto available = sysfs_.Read(type_dir + "/available_instances"); available.ok()) {
    if (auto count = sysfs::ParseDecimalAttribute(*available); count.ok() && *count <= 0) {
      return NoCapacity(mdev, "available_instances is 0");
    }
  }
  const int err = writer_.Write(sysfs_.Path(type_dir + "/create"), mdev.uuid);
  if (err == EEXIST) {
    return CheckExisting(mdev);
  }
  if (err == EUSERS || err == ENOSPC) {
    return NoCapacity(mdev, "the kernel refused the create: " + ErrnoText(err));
  }
  if (err != 0) {
    return MakeError(ErrorKind::kFailedPrecondition, Describe(mdev) + ": writing the UUID to " +
                                                         sysfs_.Path(type_dir + "/create") +
                                                         " failed: " + ErrnoText(err));
  }
  if (!Exists(mdev.uuid)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     Describe(mdev) + ": the kernel accepted the create but " +
                         sysfs_.Path(InstancePath(mdev.uuid)) + " does not exist");
  }
  return Status::Ok();
}

Status MdevLifecycle::Remove(const std::string& uuid, Deadline deadline) {
  if (!Exists(uuid)) return Status::Ok();
  auto real = sysfs_.RealPath(InstancePath(uuid));
  if (!real.ok()) return real.error().Wrap("cannot find the parent of mdev " + uuid);
  // The instance lives in its parent's directory; the parent's lock is the one that can be held.
  const std::string parent = std::filesystem::path(*real).parent_path().filename().string();
  auto err = gate_.Write(parent, sysfs_.Path(InstancePath(uuid) + "/remove"), "1",
                         deadline.RemainingOr(timeout_));
  if (!err.ok()) {
    return err.error().Wrap("removing mdev " + uuid +
                            " (it is probably still in use by a VM; retry once it is let go)");
  }
  if (*err != 0 && Exists(uuid)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "removing mdev " + uuid + " failed: " + ErrnoText(*err) +
                         (*err == EBUSY ? " (it is still in use by a VM)" : ""));
  }
  return Status::Ok();
}

Result<int> MdevLifecycle::IommuGroup(const std::string& uuid) const {
  auto group = sysfs_.LinkBaseName(InstancePath(uuid) + "/iommu_group");
  if (!group.ok()) return group.error().Wrap("mdev " + uuid + " has no IOMMU group");
  auto number = sysfs::ParseDecimalAttribute(*group);
  if (!number.ok() || *number < 0) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "mdev " + uuid + ": iommu_group link does not name a group: " + *group);
  }
  return static_cast<int>(*number);
}

}  // namespace vfio_dra::vfio
