// DeviceSources: what every command that reads the node's devices (serve, discover, slices)
// starts from, opened one way: the admin policy (--config, else the built-in default), the
// pci.ids names and the kernel's VFIO variant-driver aliases (--modules-alias; by default this
// kernel's modules.alias, but only when the tree read is the real /sys: a simulated tree is not
// this kernel's). An invalid policy is an error naming the file, line and key; missing names are
// only a warning, since devices are published without them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "discovery/admin_policy.h"
#include "discovery/pci_names.h"
#include "discovery/vfio_driver_choice.h"

namespace vfio_dra::cmd {

struct DeviceSources {
  discovery::AdminPolicy policy;
  std::shared_ptr<const discovery::VfioDriverChooser> vfio_drivers;  // never null
  std::unique_ptr<discovery::PciNames> names;  // null when pci.ids cannot be used
  std::vector<std::string> warnings;           // e.g. why names are unavailable
};

struct DeviceSourceOptions {
  std::string config_file;
  std::string sysfs_root;
  std::string pci_ids;
  std::string modules_alias;  // empty: the default described above
};

Result<DeviceSources> OpenDeviceSources(const DeviceSourceOptions& options);

}  // namespace vfio_dra::cmd
