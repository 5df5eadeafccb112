// `vfio-dra-plugin slices`: prints, offline and read only, exactly the ResourceSlices the daemon
// would publish for this node, after the client-side validation the daemon applies.
#pragma once

#include <string>

namespace vfio_dra::cmd {

struct SlicesOptions {
  std::string sysfs_root = "/sys";
  std::string config_file;
  std::string node_name;  // default: $NODE_NAME, else the host name
  std::string driver_name = "vfio.dra.io";
  std::string kubernetes_version = "1.35";
  std::string api_version = "v1";
  std::string output = "yaml";
  std::string pci_ids = "/usr/share/misc/pci.ids";
  std::string modules_alias;  // empty: this kernel's, when reading the real /sys
  // Where the daemon keeps the mdev type maxima it learned (read only; a missing file is fine).
  std::string plugin_data_dir;  // default /var/lib/kubelet/plugins/<driver-name>
};

int RunSlices(SlicesOptions options);

}  // namespace vfio_dra::cmd
