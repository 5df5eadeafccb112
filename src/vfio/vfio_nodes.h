// The /dev nodes a VM container needs for VFIO devices, found from sysfs: the group node
// /dev/vfio/<group> (or noiommu-<group>), the per-device cdevs /dev/vfio/devices/vfioN, and
// /dev/iommu. Device numbers are read from the sysfs `dev` files, never assumed (only the legacy
// container /dev/vfio/vfio has a fixed number, misc 10:196), and the node under --dev-root must be
// a character device with that number: a runtime stats it when it creates the container.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::vfio {

struct CharDeviceNode {
  std::string path;  // path on the host and in the container, e.g. "/dev/vfio/30"
  int64_t major = 0;
  int64_t minor = 0;
  bool operator==(const CharDeviceNode&) const = default;
};

class VfioNodes {
 public:
  VfioNodes(const sysfs::SysfsReader& sysfs, std::string dev_root)
      : sysfs_(sysfs), dev_root_(std::move(dev_root)) {}

  // /dev/vfio/vfio, the legacy container.
  Result<CharDeviceNode> Container() const;
  // The group node of IOMMU group `group`; it exists only while a device of the group is bound
  // to a VFIO driver.
  Result<CharDeviceNode> Group(int group) const;
  // The vfio-dev cdevs of a device bound to a VFIO driver, by its sysfs directory relative to
  // the root ("bus/pci/devices/<address>", "bus/mdev/devices/<uuid>"); empty on kernels
  // without device cdevs.
  Result<std::vector<CharDeviceNode>> DeviceCdevs(const std::string& device_dir) const;
  // /dev/iommu; kNotFound when iommufd is not available.
  Result<CharDeviceNode> Iommufd() const;

 private:
  // Reads "<major>:<minor>" from the sysfs `dev` file and checks the node under --dev-root.
  Result<CharDeviceNode> Verified(const std::string& sysfs_dev_file,
                                  const std::string& dev_path) const;
  Status CheckNode(const CharDeviceNode& node) const;

  const sysfs::SysfsReader& sysfs_;
  std::string dev_root_;
};

// Parses a sysfs `dev` attribute ("241:0\n").
Result<std::pair<int64_t, int64_t>> ParseDevNumbers(const std::string& text);

}  // namespace vfio_dra::vfio
