// ScanInventory: reads the node's PCI functions, IOMMU groups, SR-IOV relations and mediated
// device parents from a sysfs tree. Read only. A function or mdev entry that cannot be read or
// parsed is skipped with one warning naming the path; the scan itself never fails on bad entries.
// Attributes whose reads take the kernel's device lock (driver_override, sriov_numvfs) are not
// read for devices `busy` names: an unbind blocked on such a device (a VM still holds it) would
// block the scan too.
#pragma once

#include <string>

#include "discovery/inventory.h"
#include "discovery/pci_names.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::discovery {

// `names` may be null (no names are filled in). driver_override, whose read takes the kernel's
// device lock (and so blocks while any process is stuck unbinding the function), is read only
// with `read_overrides`. Nothing else read here takes the lock.
Inventory ScanInventory(const sysfs::SysfsReader& sysfs, PciNames* names,
                        bool read_overrides = false);

// One PCI function, read now (no names): what device preparation re-checks before it touches a
// device. kNotFound when the device is gone. Without `read_override`, driver_override (whose
// read takes the kernel's device lock, and blocks for as long as any process is stuck unbinding
// the function) is left unread; nothing else read here takes the lock.
Result<PciFunction> ReadPciFunction(const sysfs::SysfsReader& sysfs, const std::string& address,
                                    bool read_override = true);

}  // namespace vfio_dra::discovery
