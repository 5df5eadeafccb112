// VfioDriverChooser: which VFIO driver prepare binds a PCI function to. Current hardware needs
// the kernel's vendor variant drivers (mlx5_vfio_pci for live migration of ConnectX VFs,
// nvgrace-gpu-vfio-pci for Grace Hopper's coherent memory, ...), which are vfio-pci plus a vendor
// part and serve only the devices their module aliases name. The choice, in order:
//  1. the first `vfioDrivers` rule of the admin policy whose `match` selects the function;
//  2. the most specific `vfio_pci:` alias of the kernel's modules.alias matching its modalias;
//  3. vfio-pci.
// A module name is resolved to the driver it registers through /sys/module/<module>/drivers
// (module names use '_', driver names often '-'); a driver that is not registered is reported as
// not loaded, and prepare then fails naming the module to load instead of binding another driver
// behind the admin's back. The choice is made from sysfs as it is now, so discovery (the
// published `vfioDriver` attribute) and prepare (the bind) agree unless a module was loaded in
// between, and then prepare follows the node.
#pragma once

#include <vector>

#include "discovery/admin_policy.h"
#include "discovery/inventory.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/vfio_aliases.h"

namespace vfio_dra::discovery {

class VfioDriverChooser {
 public:
  VfioDriverChooser() = default;  // no aliases, no rules: vfio-pci for every function
  VfioDriverChooser(sysfs::VfioAliases aliases, std::vector<VfioDriverRule> rules)
      : aliases_(std::move(aliases)), rules_(std::move(rules)) {}

  VfioDriverChoice Choose(const PciFunction& fn, const sysfs::SysfsReader& sysfs) const;

 private:
  sysfs::VfioAliases aliases_;
  std::vector<VfioDriverRule> rules_;
};

// Whether `driver` is the VFIO driver vfio-dra binds `fn` to, or plain vfio-pci: a function on it
// is held for VMs, not by a host driver.
bool IsVfioDriverFor(const PciFunction& fn, const std::string& driver);

}  // namespace vfio_dra::discovery
