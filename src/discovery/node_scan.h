// NodeScan: one complete look at the node: the inventory and what the policy makes of it. The
// daemon keeps the latest one; the slice publisher and device preparation read it.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "base/sha256.h"
#include "discovery/admin_policy.h"
#include "discovery/device_selection.h"
#include "discovery/inventory.h"
#include "discovery/inventory_scanner.h"
#include "discovery/pci_names.h"
#include "discovery/vfio_driver_choice.h"
#include "sysfs/sysfs_reader.h"

namespace vfio_dra::discovery {

struct NodeScan {
  Inventory inventory;
  DeviceSelection selection;
  // The GPUs' whole frame buffers: the context's, updated with what idle GPUs show now; the
  // daemon keeps them for the next scan (vgpu_gpu_sizes_file.h).
  VgpuGpuSizes vgpu_sizes;
};

// A function vfio-dra has bound for a prepared claim.
struct ManagedFunction {
  std::string original_driver;           // the driver it had before ("" for none)
  std::string vfio_driver = "vfio-pci";  // the VFIO driver it was bound to
  bool operator==(const ManagedFunction&) const = default;
};

// What the daemon knows beyond sysfs when it scans.
struct ScanContext {
  // Functions vfio-dra has bound for prepared claims.
  std::map<std::string, ManagedFunction> managed;
  // Picks each function's VFIO driver; null: vfio-pci for every function.
  const VfioDriverChooser* vfio_drivers = nullptr;
  // The GPUs' whole frame buffers seen by earlier scans while they were idle.
  VgpuGpuSizes vgpu_sizes;
};

// Scans the node under `policy`; `names` may be null.
std::shared_ptr<const NodeScan> ScanNode(const sysfs::SysfsReader& sysfs, PciNames* names,
                                         const AdminPolicy& policy,
                                         const ScanContext& context = {});

// A digest of what matters to publishing (published devices, their attributes and the mdev types
// with their counts, and the functions' health signals); two scans with equal fingerprints publish
// the same slices. A digest, not the summary itself: the idle daemon keeps one, and with 1,000
// devices the summary is 1.6 MB.
Sha256 Fingerprint(const NodeScan& scan);

}  // namespace vfio_dra::discovery
