// NodeScan: one complete look at the node: the inventory and what the policy makes of it. The
// daemon keeps the latest one; the slice publisher and device preparation read it.
#pragma once

#include <memory>
#include <string>

#include "discovery/admin_policy.h"
#include "discovery/device_selection.h"
#include "discovery/inventory.h"
#include "discovery/inventory_scanner.h"
#include "discovery/pci_names.h"
#include "discovery/sysfs_reader.h"

namespace vfio_dra::discovery {

struct NodeScan {
  Inventory inventory;
  DeviceSelection selection;
};

// Scans the node under `policy`; `names` and `busy` may be null (see ScanInventory).
std::shared_ptr<const NodeScan> ScanNode(const SysfsReader& sysfs, PciNames* names,
                                         const AdminPolicy& policy, const DeviceBusy& busy = {});

// A stable summary of what matters to publishing (published devices, their attributes and the
// mdev types with their counts); two scans with equal fingerprints publish the same slices.
std::string Fingerprint(const NodeScan& scan);

}  // namespace vfio_dra::discovery
