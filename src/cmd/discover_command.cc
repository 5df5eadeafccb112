#include "cmd/discover_command.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "cmd/device_sources.h"
#include "discovery/admin_policy.h"
#include "discovery/device_selection.h"
#include "discovery/discover_report.h"
#include "discovery/inventory_scanner.h"
#include "discovery/node_scan.h"
#include "discovery/pci_names.h"

namespace vfio_dra::cmd {

int RunDiscover(const DiscoverOptions& options) {
  auto sources = OpenDeviceSources(
      {options.config_file, options.sysfs_root, options.pci_ids, options.modules_alias});
  if (!sources.ok()) {
    std::cerr << "vfio-dra-plugin discover: " << sources.error().message << std::endl;
    return 1;
  }
  const discovery::AdminPolicy& policy = sources->policy;
  sysfs::SysfsReader sysfs(options.sysfs_root);
  discovery::ScanContext scan_context;
  scan_context.read_driver_overrides = true;  // the report shows them
  scan_context.vfio_drivers = sources->vfio_drivers.get();
  auto scan = discovery::ScanNode(sysfs, sources->names.get(), policy, scan_context);
  discovery::Inventory inventory = scan->inventory;
  inventory.warnings.insert(inventory.warnings.end(), sources->warnings.begin(),
                            sources->warnings.end());
  const discovery::DeviceSelection& selection = scan->selection;
  const discovery::DiscoverContext context{options.sysfs_root, policy.source};
  if (options.output == "json") {
    std::cout << discovery::DiscoverJson(inventory, selection, context).dump(2) << std::endl;
  } else {
    std::cout << discovery::DiscoverTable(inventory, selection, context);
  }
  return 0;
}

}  // namespace vfio_dra::cmd
