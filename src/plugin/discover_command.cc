#include "plugin/discover_command.h"

#include <iostream>

#include "discovery/admin_policy.h"
#include "discovery/device_selection.h"
#include "discovery/discover_report.h"
#include "discovery/inventory_scanner.h"
#include "discovery/pci_names.h"

namespace vfio_dra::plugin {

int RunDiscover(const DiscoverOptions& options) {
  discovery::AdminPolicy policy;
  if (!options.config_file.empty()) {
    auto loaded = discovery::LoadAdminPolicy(options.config_file);
    if (!loaded.ok()) {
      std::cerr << "vfio-dra-plugin discover: " << loaded.error().message << std::endl;
      return 1;
    }
    policy = std::move(*loaded);
  }
  discovery::SysfsReader sysfs(options.sysfs_root);
  auto names = discovery::PciNames::Open({options.sysfs_root, options.pci_ids, false});
  if (!names.ok()) {
    std::cerr << "vfio-dra-plugin discover: device names unavailable: " << names.error().message
              << std::endl;
  }
  discovery::Inventory inventory =
      discovery::ScanInventory(sysfs, names.ok() ? names->get() : nullptr);
  if (names.ok() && !(*names)->LoadError().empty()) {
    inventory.warnings.push_back("device names unavailable: " + (*names)->LoadError());
  }
  const discovery::DeviceSelection selection = discovery::SelectDevices(inventory, policy);
  const discovery::DiscoverContext context{options.sysfs_root, policy.source};
  if (options.output == "json") {
    std::cout << discovery::DiscoverJson(inventory, selection, context).dump(2) << std::endl;
  } else {
    std::cout << discovery::DiscoverTable(inventory, selection, context);
  }
  return 0;
}

}  // namespace vfio_dra::plugin
