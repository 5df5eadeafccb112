// `vfio-dra-plugin discover`: a read-only look at what vfio-dra would publish on this node and
// why it would not publish the rest, and which privileges the plugin would lack for them (as
// `serve` logs them at start). Never writes to sysfs: the privilege check opens attributes for
// writing and closes them unwritten.
#pragma once

#include <string>

namespace vfio_dra::cmd {

struct DiscoverOptions {
  std::string sysfs_root = "/sys";
  std::string config_file;
  std::string output = "table";  // table | json
  std::string pci_ids = "/usr/share/misc/pci.ids";
  std::string modules_alias;  // empty: this kernel's, when reading the real /sys
  // As `serve` is given them, for the privilege check.
  std::string dev_root = "/dev";
  std::string host_netns;
  std::string process_status = "/proc/self/status";  // tests: another process's capabilities
  // Never open a sysfs attribute for writing (not even unwritten): the privilege section then
  // leaves sysfs write access out, and says so.
  bool no_write_probes = false;
};

// Returns the exit code: 0, or 1 when the policy cannot be loaded.
int RunDiscover(const DiscoverOptions& options);

}  // namespace vfio_dra::cmd
