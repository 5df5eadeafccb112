// ChangeProbe: a cheap digest of what makes a full device scan come out differently, so the
// periodic safety-net rescan can be skipped while nothing changed. It reads only what changes
// without a PCI hot-plug being visible in the device list: each function's bound driver and IOMMU
// group (two readlinkat per function, relative to the bus directory) and, per mdev parent, each
// type's available_instances and its instance list. It never reads attributes that take the
// kernel's device lock (driver_override, sriov_numvfs), so a device stuck in an unbind cannot stall
// it. Uevents still trigger full scans, and a full scan still runs at least every
// DeviceWatcherOptions::full_rescan_interval: the probe narrows the periodic work, it is not
// trusted to see everything.
#pragma once

#include <cstdint>

#include "sysfs/sysfs_reader.h"

namespace vfio_dra::discovery {

// A digest of the node's PCI functions, their drivers and IOMMU groups, and the mdev types' state.
// Two equal digests mean no device was added, removed, bound, unbound or put in another group, and
// no mdev created or removed.
uint64_t ProbeDeviceState(const sysfs::SysfsReader& sysfs);

}  // namespace vfio_dra::discovery
