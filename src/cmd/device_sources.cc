#include "cmd/device_sources.h"

namespace vfio_dra::cmd {

Result<DeviceSources> OpenDeviceSources(const std::string& config_file,
                                        const std::string& sysfs_root, const std::string& pci_ids) {
  DeviceSources sources;
  if (!config_file.empty()) {
    auto loaded = discovery::LoadAdminPolicy(config_file);
    if (!loaded.ok()) return loaded.error();
    sources.policy = std::move(*loaded);
  }
  auto names = discovery::PciNames::Open({sysfs_root, pci_ids, false});
  if (!names.ok()) {
    sources.warnings.push_back("device names unavailable: " + names.error().message);
    return sources;
  }
  sources.names = std::move(*names);
  if (!sources.names->LoadError().empty()) {
    sources.warnings.push_back("device names unavailable: " + sources.names->LoadError());
  }
  return sources;
}

}  // namespace vfio_dra::cmd
