// `vfio-dra-plugin discover`: a read-only look at what vfio-dra would publish on this node and
// why it would not publish the rest. Never writes to sysfs.
#pragma once

#include <string>

namespace vfio_dra::cmd {

struct DiscoverOptions {
  std::string sysfs_root = "/sys";
  std::string config_file;
  std::string output = "table";  // table | json
  std::string pci_ids = "/usr/share/misc/pci.ids";
  std::string modules_alias;  // empty: this kernel's, when reading the real /sys
};

// Returns the exit code: 0, or 1 when the policy cannot be loaded.
int RunDiscover(const DiscoverOptions& options);

}  // namespace vfio_dra::cmd
