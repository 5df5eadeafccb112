// ScanInventory: reads the node's PCI functions, IOMMU groups, SR-IOV relations and mediated
// device parents from a sysfs tree. Read only. A function or mdev entry that cannot be read or
// parsed is skipped with one warning naming the path; the scan itself never fails on bad entries.
// Nothing read here takes the kernel's device lock, so a process stuck unbinding a device (a VM
// still holds it) never blocks a scan: IDs and class come from modalias (not uevent), a PF's
// enabled VFs are counted by its virtfn links (not sriov_numvfs), and driver_override is not read
// (see sysfs/bounded_reads.h for the report that shows it).
#pragma once

#include <string>

#include "discovery/inventory.h"
#include "discovery/pci_names.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::discovery {

// `names` may be null (no names are filled in).
Inventory ScanInventory(const sysfs::SysfsReader& sysfs, PciNames* names);

// One PCI function, read now (no names, no driver_override): what device preparation plans
// from. kNotFound when the device is gone.
Result<PciFunction> ReadPciFunction(const sysfs::SysfsReader& sysfs, const std::string& address);

}  // namespace vfio_dra::discovery
