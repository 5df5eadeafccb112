#include "discovery/node_scan.h"

#include <nlohmann/json.hpp>

#include "discovery/discover_report.h"
#include "discovery/inventory_scanner.h"
#include "discovery/vgpu_selection.h"

namespace vfio_dra::discovery {

std::shared_ptr<const NodeScan> ScanNode(const sysfs::SysfsReader& sysfs, PciNames* names,
                                         const AdminPolicy& policy, const ScanContext& context) {
  auto scan = std::make_shared<NodeScan>();
  scan->inventory = ScanInventory(sysfs, names);
  if (context.vfio_drivers != nullptr) {
    for (auto& [address, fn] : scan->inventory.functions) {
      if (!fn.IsBridge()) fn.vfio_driver = context.vfio_drivers->Choose(fn, sysfs);
    }
  }
  for (const auto& [address, managed] : context.managed) {
    auto it = scan->inventory.functions.find(address);
    if (it == scan->inventory.functions.end()) continue;
    PciFunction& fn = it->second;
    // Someone bound a function a claim holds to a third driver: the VM has lost it. On its
    // original driver it is between the steps of a prepare or an unprepare, or back after a
    // reboot, and on none it is mid-switch: neither says anything is wrong.
    if (!fn.driver.empty() && fn.driver != managed.vfio_driver &&
        fn.driver != managed.original_driver) {
      fn.foreign_driver = fn.driver;
    }
    // Only while the VFIO driver holds it: after a reboot the function is back on its own driver.
    if (fn.driver != managed.vfio_driver) continue;
    fn.driver = managed.original_driver;
    fn.bound_by_vfio_dra = true;
  }
  scan->vgpu_sizes = ObserveVgpuGpuSizes(scan->inventory, context.vgpu_sizes);
  scan->selection = SelectDevices(scan->inventory, policy, scan->vgpu_sizes);
  return scan;
}

Sha256 Fingerprint(const NodeScan& scan) {
  // The JSON report holds every field that is published, and nothing time-dependent.
  nlohmann::json json = DiscoverJson(scan.inventory, scan.selection, {});
  json.erase("warnings");
  // What a prepare or unprepare of ours changes and nothing publishes (ScanNode shows a function
  // a claim holds on its driver from before): kept, every claim's bind and restore would hand on
  // a scan, and the publisher would rebuild and digest the whole pool twice per claim to write
  // nothing. (A network VF's netdev goes while it is on vfio-pci: that scan is handed on, and the
  // slice builder publishes the netdev it had, so nothing is written.)
  for (nlohmann::json& function : json["functions"]) {
    function.erase("boundByVfioDra");
    function.erase("driverOverride");
  }
  // The health signals device taints come from are not in the report; without them a rescan that
  // sees an AER count or a PF link change would not be handed on, and no taint would follow.
  nlohmann::json health = nlohmann::json::object();
  for (const auto& [address, fn] : scan.inventory.functions) {
    if (!fn.aer_fatal_errors && fn.aer_unreadable.empty() && !fn.link_down &&
        fn.foreign_driver.empty()) {
      continue;
    }
    health[address] = {fn.aer_fatal_errors.value_or(-1), fn.aer_unreadable, fn.link_down,
                       fn.foreign_driver};
  }
  json["health"] = std::move(health);
  // A function listed but unreadable is still there, and one that has since left the bus is gone:
  // a claim's device on it is kept as it was or tainted lost, so the two must not look the same.
  nlohmann::json unreadable = nlohmann::json::array();
  for (const std::string& address : scan.inventory.listed) {
    if (!scan.inventory.functions.contains(address)) unreadable.push_back(address);
  }
  json["unreadable"] = std::move(unreadable);
  return Sha256Of(json.dump());
}

}  // namespace vfio_dra::discovery
