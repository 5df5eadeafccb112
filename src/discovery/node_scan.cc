#include "discovery/node_scan.h"

#include "discovery/discover_report.h"
#include "discovery/inventory_scanner.h"

namespace vfio_dra::discovery {

std::shared_ptr<const NodeScan> ScanNode(const SysfsReader& sysfs, PciNames* names,
                                         const AdminPolicy& policy, const DeviceBusy& busy) {
  auto scan = std::make_shared<NodeScan>();
  scan->inventory = ScanInventory(sysfs, names, busy);
  scan->selection = SelectDevices(scan->inventory, policy);
  return scan;
}

std::string Fingerprint(const NodeScan& scan) {
  // The JSON report holds every field that is published, and nothing time-dependent.
  nlohmann::json json = DiscoverJson(scan.inventory, scan.selection, {});
  json.erase("warnings");
  return json.dump();
}

}  // namespace vfio_dra::discovery
