// ScanInventory: reads the node's PCI functions, IOMMU groups, SR-IOV relations and mediated
// device parents from a sysfs tree. Read only. A function or mdev entry that cannot be read or
// parsed is skipped with one warning naming the path; the scan itself never fails on bad entries.
#pragma once

#include "discovery/inventory.h"
#include "discovery/pci_names.h"
#include "discovery/sysfs_reader.h"

namespace vfio_dra::discovery {

// `names` may be null (no names are filled in).
Inventory ScanInventory(const SysfsReader& sysfs, PciNames* names);

// One PCI function, read now (no names): what device preparation re-checks before it touches a
// device. kNotFound when the device is gone.
Result<PciFunction> ReadPciFunction(const SysfsReader& sysfs, const std::string& address);

}  // namespace vfio_dra::discovery
