#include "cmd/discover_command.h"

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cmd/device_sources.h"
#include "discovery/admin_policy.h"
#include "discovery/device_selection.h"
#include "discovery/discover_report.h"
#include "discovery/inventory_scanner.h"
#include "discovery/node_scan.h"
#include "discovery/pci_names.h"
#include "sysfs/bounded_reads.h"
#include "sysfs/sysfs_parse.h"
#include "sysfs/sysfs_writer.h"
#include "vfio/privilege_check.h"

namespace vfio_dra::cmd {
namespace {

// The report shows each function's driver_override. Admins run discover when a device is stuck
// (a VM still holds it while an unbind waits), and then this read waits for the device lock in an
// unkillable sleep: it is bounded, and a function whose read does not answer gets a warning.
void ReadDriverOverrides(const sysfs::SysfsReader& sysfs, discovery::Inventory& inventory) {
  constexpr std::chrono::milliseconds kStall(2000);
  std::vector<std::string> paths;
  std::vector<discovery::PciFunction*> functions;
  for (auto& [address, fn] : inventory.functions) {
    paths.push_back("bus/pci/devices/" + address + "/driver_override");
    functions.push_back(&fn);
  }
  auto read = sysfs::ReadAttributesBounded(sysfs, paths, kStall);
  for (size_t i = 0; i < read.size(); ++i) {
    if (read[i].ok()) {
      functions[i]->driver_override = sysfs::ParseDriverOverride(*read[i]);
    } else if (read[i].error().kind != ErrorKind::kNotFound) {
      inventory.warnings.push_back(
          "PCI function " + functions[i]->address +
          " is shown without its driver_override: " + read[i].error().message);
    }
  }
}

// The privilege check's lines, as a section after the table.
std::string PrivilegeSection(const std::vector<vfio::MissingPrivilege>& missing,
                             bool write_probed) {
  std::string out = "\nPrivileges for the features of these devices: ";
  const std::string unprobed =
      write_probed ? "" : " (sysfs write access not probed: --no-write-probes)";
  if (missing.empty()) return out + "none missing" + unprobed + "\n";
  out += std::to_string(missing.size()) + " missing" + unprobed + "\n";
  for (const vfio::MissingPrivilege& m : missing) out += "  " + m.Line() + "\n";
  return out;
}

nlohmann::json PrivilegeJson(const std::vector<vfio::MissingPrivilege>& missing) {
  nlohmann::json out = nlohmann::json::array();
  for (const vfio::MissingPrivilege& m : missing) {
    out.push_back({{"feature", vfio::PrivilegedFeatureName(m.feature)},
                   {"privilege", m.privilege},
                   {"error", m.error},
                   {"grant", m.grant},
                   {"message", m.Line()}});
  }
  return out;
}

}  // namespace

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
  scan_context.vfio_drivers = sources->vfio_drivers.get();
  auto scan = discovery::ScanNode(sysfs, sources->names.get(), policy, scan_context);
  discovery::Inventory inventory = scan->inventory;
  ReadDriverOverrides(sysfs, inventory);
  inventory.warnings.insert(inventory.warnings.end(), sources->warnings.begin(),
                            sources->warnings.end());
  const discovery::DeviceSelection& selection = scan->selection;
  const discovery::DiscoverContext context{options.sysfs_root, policy.source};
  vfio::PrivilegeCheckOptions check;
  check.dev_root = options.dev_root;
  check.host_netns = options.host_netns;
  check.process_status = options.process_status;
  sysfs::KernelSysfsWriter probe;  // ProbeWritable only
  vfio::PrivilegeNeeds needs = vfio::PrivilegeNeedsOf(scan->inventory, selection);
  if (options.no_write_probes) {
    for (auto& [feature, attributes] : needs.features) attributes.clear();
  }
  const std::vector<vfio::MissingPrivilege> missing =
      vfio::CheckPrivileges(needs, sysfs, probe, check);
  if (options.output == "json") {
    nlohmann::json out = discovery::DiscoverJson(inventory, selection, context);
    out["missingPrivileges"] = PrivilegeJson(missing);
    std::cout << out.dump(2) << std::endl;
  } else {
    std::cout << discovery::DiscoverTable(inventory, selection, context)
              << PrivilegeSection(missing, !options.no_write_probes);
  }
  return 0;
}

}  // namespace vfio_dra::cmd
