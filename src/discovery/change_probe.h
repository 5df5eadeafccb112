// ChangeProbe: a cheap digest of what makes a full device scan come out differently, so the
// periodic safety-net rescan can be skipped while nothing changed. It reads only what changes
// without a PCI hot-plug being visible in the device list: the bus's function list, each PCI
// driver's list of bound functions (one directory read per driver instead of one link per
// function: the kernel adds and removes a function's `driver` link and its entry under the
// driver together), per mdev parent, each type's available_instances and instance list, and per
// NVIDIA vGPU VF its current and creatable vGPU types (a type change makes no uevent). It
// never reads attributes that take the kernel's device lock (driver_override, sriov_numvfs,
// uevent), so a device stuck in an unbind cannot stall it. It also reads what device taints come
// from and no uevent announces: the aer_dev_fatal of each function that has one (the kernel makes
// it when it adds an AER-capable function, so which functions have one is read with the IOMMU
// links below), and the operstate of the network interfaces of each SR-IOV PF that has VFs
// (device_taints.h).
//
// IOMMU groups: the kernel lists a hot-added function on the bus before it links the function into
// its group (the IOMMU core runs from the bus's add notifier), so a scan can catch a function
// without its group. A function's group never changes while it stays listed, so the links are read
// in full only when the function list changed, and otherwise only for the functions that had no
// group then: a link that appears later changes the digest, and the next check scans again.
//
// Uevents still trigger full scans, and a full scan still runs at least every
// DeviceWatcherOptions::full_rescan_interval: the probe narrows the periodic work, it is not
// trusted to see everything. Not thread-safe: one caller (the watcher's thread) at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sysfs/sysfs_reader.h"

namespace vfio_dra::discovery {

class ChangeProbe {
 public:
  explicit ChangeProbe(const sysfs::SysfsReader& sysfs) : sysfs_(sysfs) {}

  // A digest of the node's PCI functions, their drivers and IOMMU groups, and the mdev types'
  // state. Two equal digests mean no device was added, removed, bound, unbound or linked into a
  // group, and no mdev created or removed.
  uint64_t Probe();

  // Functions read without an IOMMU group link by the last full read of the links (for tests).
  const std::vector<std::string>& ungrouped() const { return ungrouped_; }

 private:
  const sysfs::SysfsReader& sysfs_;
  bool listed_ = false;
  uint64_t function_list_ = 0;  // digest of the bus's function list at the last probe
  std::vector<std::string> ungrouped_;
  std::vector<std::string> with_vfs_;  // SR-IOV PFs with VFs at the last full read of the links
  std::vector<std::string> with_aer_;  // functions with AER counters at that read
};

}  // namespace vfio_dra::discovery
