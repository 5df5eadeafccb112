// ScanInventory: reads the node's PCI functions, IOMMU groups, SR-IOV relations and mediated
// device parents from a sysfs tree. Read only. A function or mdev entry that cannot be read or
// parsed is skipped with one warning naming the path; the scan itself never fails on bad entries.
// Attributes whose reads take the kernel's device lock (driver_override, sriov_numvfs) are not
// read for devices `busy` names: an unbind blocked on such a device (a VM still holds it) would
// block the scan too.
#pragma once

#include <functional>
#include <string>

#include "discovery/inventory.h"
#include "discovery/pci_names.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::discovery {

// True for a PCI function whose kernel lock an operation of this daemon is blocked in.
using DeviceBusy = std::function<bool(const std::string& address)>;

// `names` may be null (no names are filled in); so may `busy` (no device is busy).
Inventory ScanInventory(const sysfs::SysfsReader& sysfs, PciNames* names,
                        const DeviceBusy& busy = {});

// One PCI function, read now (no names): what device preparation re-checks before it touches a
// device. kNotFound when the device is gone. Without `lock_taking_reads`, the attributes whose
// reads take the kernel's device lock (driver_override, sriov_numvfs) are left unread: they block
// for as long as any process holds the device in an unbind, and the caller reads what it needs
// of them with a bound on the wait.
Result<PciFunction> ReadPciFunction(const sysfs::SysfsReader& sysfs, const std::string& address,
                                    bool lock_taking_reads = true);

}  // namespace vfio_dra::discovery
