#include "cmd/device_sources.h"

#include <sys/utsname.h>

#include <filesystem>

namespace vfio_dra::cmd {
namespace {

std::string DefaultModulesAlias(const std::string& sysfs_root) {
  std::error_code ec;
  if (std::filesystem::weakly_canonical(sysfs_root, ec) != "/sys") return "";
  utsname name{};
  if (uname(&name) != 0) return "";
  return std::string("/lib/modules/") + name.release + "/modules.alias";
}

}  // namespace

Result<DeviceSources> OpenDeviceSources(const DeviceSourceOptions& options) {
  DeviceSources sources;
  if (!options.config_file.empty()) {
    auto loaded = discovery::LoadAdminPolicy(options.config_file);
    if (!loaded.ok()) return loaded.error();
    sources.policy = std::move(*loaded);
  }
  const std::string aliases_path = options.modules_alias.empty()
                                       ? DefaultModulesAlias(options.sysfs_root)
                                       : options.modules_alias;
  sysfs::VfioAliases aliases;
  if (!aliases_path.empty()) {
    auto loaded = sysfs::VfioAliases::Load(aliases_path);
    if (!loaded.ok()) {
      sources.warnings.push_back(
          "VFIO variant drivers unknown, functions are bound to vfio-pci "
          "unless the policy's vfioDrivers says otherwise: " +
          loaded.error().message);
    } else if (loaded->empty() && !std::filesystem::exists(aliases_path)) {
      sources.warnings.push_back("VFIO variant drivers unknown (no " + aliases_path +
                                 "; mount the host's /lib/modules): functions are bound to "
                                 "vfio-pci unless the policy's vfioDrivers says otherwise");
    } else {
      aliases = std::move(*loaded);
    }
  }
  sources.vfio_drivers = std::make_shared<const discovery::VfioDriverChooser>(
      std::move(aliases), sources.policy.vfio_drivers);
  auto names = discovery::PciNames::Open({options.sysfs_root, options.pci_ids, false});
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
