// Device health for the kubelet's health stream (dra-health v1 and v1alpha1): a verdict for every
// device this node publishes and every device a completed prepare holds, read fresh from sysfs
// each time.
// A device is UNHEALTHY when its PCI function (or an mdev's parent) has vanished, when the
// function lost or changed its IOMMU group since it was published, when a prepared function is no
// longer on the VFIO driver it was bound to, or when a prepared mdev is gone; HEALTHY otherwise.
// A tainted device says the taint's reason after its own problem (both), and is UNHEALTHY when a
// taint is NoSchedule. Addresses and UUIDs come from our own slices and checkpoint, and are still
// checked for form before they become paths.
#pragma once

#include <string>
#include <vector>

#include "prepare/device_preparer.h"
#include "prepare/prepare_checkpoint.h"
#include "slicepublisher/published_devices.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::prepare {

// Published devices first (by name), then prepared devices that are no longer published.
std::vector<DeviceHealthStatus> CheckDeviceHealth(
    const sysfs::SysfsReader& sysfs, const slicepublisher::PublishedDevices::Snapshot& published,
    const std::vector<PreparedTarget>& prepared);

}  // namespace vfio_dra::prepare
