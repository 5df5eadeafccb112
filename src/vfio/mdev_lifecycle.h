// MdevLifecycle: creates and removes mediated devices through the mdev core's sysfs interface.
// vfio-dra creates instances under the deterministic UUIDs it published, so a create that finds
// the UUID taken by the same parent and type is the earlier attempt's instance (success), and a
// UUID taken by anything else is an error. Capacity is the kernel's to decide: 0 available
// instances or EUSERS fails the claim with the parent and type named.
#pragma once

#include <string>

#include "base/deadline.h"
#include "base/result.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/sysfs_writer.h"
#include "vfio/device_lock_gate.h"

namespace vfio_dra::vfio {

struct MdevIdentity {
  std::string parent;  // entry under class/mdev_bus
  std::string type_id;
  std::string uuid;
  bool operator==(const MdevIdentity&) const = default;
};

class MdevLifecycle {
 public:
  // Removes go through `gate`: an mdev's remove takes its parent's device lock.
  MdevLifecycle(const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer, DeviceLockGate& gate,
                std::chrono::milliseconds timeout)
      : sysfs_(sysfs), writer_(writer), gate_(gate), timeout_(timeout) {}

  // Creates the instance; one that exists already with the same parent and type is fine (a retry
  // after a crash), with another parent or type an error.
  Status Create(const MdevIdentity& mdev);
  // Removing an instance that does not exist succeeds; waits at most until `deadline`.
  Status Remove(const std::string& uuid, Deadline deadline = {});
  bool Exists(const std::string& uuid) const;
  // The instance's own IOMMU group (its /dev/vfio/<group> node is what the VM opens).
  Result<int> IommuGroup(const std::string& uuid) const;

 private:
  Status CheckExisting(const MdevIdentity& mdev) const;
  // The error for a parent without room: names what runs on it and, when another type does, the
  // policy setting that keeps one type per parent.
  Status NoCapacity(const MdevIdentity& mdev, const std::string& why) const;

  const sysfs::SysfsReader& sysfs_;
  sysfs::SysfsWriter& writer_;
  DeviceLockGate& gate_;
  std::chrono::milliseconds timeout_;
};

}  // namespace vfio_dra::vfio
