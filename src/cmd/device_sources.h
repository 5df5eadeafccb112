// DeviceSources: what every command that reads the node's devices (serve, discover, slices)
// starts from, opened one way: the admin policy (--config, else the built-in default) and the
// pci.ids names. An invalid policy is an error naming the file, line and key; missing names are
// only a warning, since devices are published without them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "discovery/admin_policy.h"
#include "discovery/pci_names.h"

namespace vfio_dra::cmd {

struct DeviceSources {
  discovery::AdminPolicy policy;
  std::unique_ptr<discovery::PciNames> names;  // null when pci.ids cannot be used
  std::vector<std::string> warnings;           // e.g. why names are unavailable
};

Result<DeviceSources> OpenDeviceSources(const std::string& config_file,
                                        const std::string& sysfs_root, const std::string& pci_ids);

}  // namespace vfio_dra::cmd
