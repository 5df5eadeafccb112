// DevicePlan: what preparing a claim means on this node, worked out before anything is touched.
// Each allocation result of this driver is looked up among the published devices and re-checked
// against sysfs now (the device still exists, with the vendor/device IDs and IOMMU group that
// were published), and its opaque config is decoded. A PCI device brings every non-bridge
// function of its IOMMU group (a GPU's audio and USB functions): VFIO hands out whole groups, and
// a group with a function left on a host driver cannot be opened.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "discovery/sysfs_reader.h"
#include "kube/resource_claim.h"
#include "plugin/vfio_config.h"
#include "slicepublisher/published_devices.h"
#include "vfio/mdev_lifecycle.h"

namespace vfio_dra::plugin {

enum class PlannedKind { kPci, kMdev };

struct PlannedDevice {
  kube::DeviceRequestAllocationResult result;
  slicepublisher::SliceDevice published;
  PlannedKind kind = PlannedKind::kPci;
  std::string address;                  // PCI: the published function
  std::vector<std::string> functions;   // PCI: every function to bind, `address` first
  std::optional<int> iommu_group;       // PCI: as published (none: unsafe no-IOMMU mode)
  vfio::MdevIdentity mdev;              // mdev
  bool mdev_created_by_driver = false;  // mdev: one of the UUIDs vfio-dra creates
  VfioConfig config;
};

struct PlanContext {
  std::string driver;
  std::string node_name;
  const slicepublisher::PublishedDevices& published;
  const discovery::SysfsReader& sysfs;
};

// One entry per result, in the order of `ours`; the first problem fails the whole claim.
Result<std::vector<PlannedDevice>> PlanClaim(
    const kube::ResourceClaim& claim, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    const PlanContext& context);

}  // namespace vfio_dra::plugin
