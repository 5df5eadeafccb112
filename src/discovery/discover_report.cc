#include "discovery/discover_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "base/text.h"

namespace vfio_dra::discovery {
namespace {

std::string Shorten(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 3) + "...";
}

std::string FunctionName(const PciFunction& fn) {
  if (fn.device_name.empty()) return fn.vendor_name.empty() ? "(unknown)" : fn.vendor_name;
  return fn.device_name;
}

std::string Outcome(const PciFunction& fn, const FunctionDecision& decision,
                    const DeviceSelection& selection) {
  if (!decision.published) return "- " + decision.reason;
  std::string out = DeviceKindName(*decision.kind);
  // A vGPU VF stays on nvidia: what it holds or can take is the story, not a VFIO driver.
  if (*decision.kind == DeviceKind::kVgpu) return out + ": " + decision.reason;
  for (const SelectedDevice& device : selection.devices) {
    if (device.address != fn.address) continue;
    if (!device.companions.empty()) {
      out += " (with ";
      for (size_t i = 0; i < device.companions.size(); ++i) {
        out += (i ? ", " : "") + device.companions[i];
      }
      out += ")";
    }
    if (device.unsafe_no_iommu) out += " UNSAFE: no IOMMU group";
  }
  // vfio-pci is the rule; anything else is worth a look before the first prepare.
  const VfioDriverChoice& vfio = fn.vfio_driver;
  if (vfio.source != VfioDriverChoice::Source::kDefault || !vfio.loaded) {
    out += ", binds to " + vfio.driver + " (" + vfio.why + ")";
    if (!vfio.loaded) out += " NOT LOADED";
  }
  return out;
}

const char* VfioSourceName(VfioDriverChoice::Source source) {
  switch (source) {
    case VfioDriverChoice::Source::kModuleAlias:
      return "moduleAlias";
    case VfioDriverChoice::Source::kPolicy:
      return "policy";
    case VfioDriverChoice::Source::kDefault:
      break;
  }
  return "default";
}

}  // namespace

std::string DiscoverTable(const Inventory& inventory, const DeviceSelection& selection,
                          const DiscoverContext& context) {
  std::string out =
      fmt::format("Node devices (sysfs root {}, policy: {}, IOMMU {})\n\n", context.sysfs_root,
                  context.policy_source, inventory.iommu_enabled ? "on" : "off");
  out += fmt::format("{:<13} {:<5} {:<10} {:<34} {:<14} {:>5} {:>4}  {}\n", "ADDRESS", "CLASS",
                     "ID", "NAME", "DRIVER", "IOMMU", "NUMA", "PUBLISHED AS / WHY NOT");
  std::map<std::string, int> counts;
  int not_published = 0;
  int vgpu_vfs = 0;
  for (const auto& [address, fn] : inventory.functions) {
    const FunctionDecision& decision = selection.functions.at(address);
    if (decision.published && decision.kind == DeviceKind::kVgpu) {
      ++vgpu_vfs;
    } else if (decision.published) {
      ++counts[DeviceKindName(*decision.kind)];
    } else {
      ++not_published;
    }
    out += fmt::format("{:<13} {:04x}  {:04x}:{:04x}  {:<34} {:<14} {:>5} {:>4}  {}\n", address,
                       fn.ClassAndSubclass(), fn.vendor_id, fn.device_id,
                       Shorten(EscapeForDisplay(FunctionName(fn)), 34),
                       Shorten(fn.driver.empty() ? "-" : fn.driver, 14),
                       fn.iommu_group ? std::to_string(*fn.iommu_group) : "-",
                       fn.numa_node ? std::to_string(*fn.numa_node) : "-",
                       Outcome(fn, decision, selection));
  }
  if (inventory.functions.empty()) out += "(no PCI functions)\n";

  int mdev_published = 0;
  if (!inventory.mdev_parents.empty()) {
    out += fmt::format("\nMediated device types\n{:<16} {:<18} {:<24} {:>9} {:>9}  {}\n", "PARENT",
                       "TYPE", "NAME", "AVAILABLE", "INSTANCES", "PUBLISHED / WHY NOT");
    for (const MdevParent& parent : inventory.mdev_parents) {
      for (const MdevType& type : parent.types) {
        const int existing = static_cast<int>(
            std::count_if(parent.instances.begin(), parent.instances.end(),
                          [&](const MdevInstance& i) { return i.type_id == type.id; }));
        std::string outcome = "?";
        for (const MdevTypeDecision& d : selection.mdev_decisions) {
          if (d.parent == parent.name && d.type_id == type.id) {
            outcome = d.published ? "mdev" : "- " + d.reason;
            if (d.published) ++mdev_published;
          }
        }
        out += fmt::format("{:<16} {:<18} {:<24} {:>9} {:>9}  {}\n", Shorten(parent.name, 16),
                           Shorten(type.id, 18), Shorten(EscapeForDisplay(type.name), 24),
                           type.available_instances, existing, outcome);
      }
    }
  }
  if (!selection.vgpu_gpus.empty()) {
    out += "\nGPUs with vGPU VFs (what their free VFs offer, created at prepare)\n";
    for (const SelectedVgpuGpu& gpu : selection.vgpu_gpus) {
      out += fmt::format("{:<13} {}\n", gpu.pf, gpu.state);
    }
  }
  std::string summary;
  for (const auto& [kind, n] : counts) {
    summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, kind);
  }
  out += fmt::format(
      "\nPublished: {} PCI device{}{}{}; {} mdev type{}{}. Not published: {} "
      "function{}.\n",
      selection.devices.size(), selection.devices.size() == 1 ? "" : "s",
      summary.empty() ? "" : " (", summary.empty() ? "" : summary + ")", mdev_published,
      mdev_published == 1 ? "" : "s",
      vgpu_vfs == 0 ? "" : fmt::format("; {} vGPU VF{}", vgpu_vfs, vgpu_vfs == 1 ? "" : "s"),
      not_published, not_published == 1 ? "" : "s");
  if (!inventory.warnings.empty()) {
    out += "\nWarnings:\n";
    for (const std::string& w : inventory.warnings) out += "  " + EscapeForDisplay(w, 400) + "\n";
  }
  return out;
}

namespace {

using nlohmann::json;

// One PCI function as `discover -o json` shows it, with what was decided for it.
json FunctionJson(const std::string& address, const PciFunction& fn,
                  const DeviceSelection& selection) {
  const FunctionDecision& decision = selection.functions.at(address);
  json entry = {{"address", address},
                {"class", fmt::format("0x{:06x}", fn.class_code)},
                {"vendorID", fmt::format("{:04x}", fn.vendor_id)},
                {"deviceID", fmt::format("{:04x}", fn.device_id)},
                {"subsystemVendorID", fmt::format("{:04x}", fn.subsystem_vendor_id)},
                {"subsystemDeviceID", fmt::format("{:04x}", fn.subsystem_device_id)},
                {"revision", fmt::format("0x{:02x}", fn.revision)},
                {"vendorName", fn.vendor_name},
                {"deviceName", fn.device_name},
                {"driver", fn.driver},
                {"boundByVfioDra", fn.bound_by_vfio_dra},
                {"driverOverride", fn.driver_override},
                {"pcieRoot", fn.pcie_root},
                {"netdevs", fn.netdevs},
                {"published", decision.published}};
  entry["iommuGroup"] = fn.iommu_group ? json(*fn.iommu_group) : json(nullptr);
  entry["numaNode"] = fn.numa_node ? json(*fn.numa_node) : json(nullptr);
  if (decision.kind) entry["kind"] = DeviceKindName(*decision.kind);
  if (!decision.reason.empty()) entry["reason"] = decision.reason;
  if (!fn.IsBridge()) {
    entry["vfioDriver"] = {{"name", fn.vfio_driver.driver},
                           {"source", VfioSourceName(fn.vfio_driver.source)},
                           {"loaded", fn.vfio_driver.loaded}};
    if (!fn.vfio_driver.why.empty()) entry["vfioDriver"]["why"] = fn.vfio_driver.why;
  }
  if (fn.sriov_pf) {
    entry["sriov"] = {{"totalVFs", fn.sriov_pf->total_vfs},
                      {"numVFs", fn.sriov_pf->num_vfs},
                      {"vfs", fn.sriov_pf->vfs}};
  }
  if (fn.sriov_vf) entry["vf"] = {{"pf", fn.sriov_vf->pf}, {"index", fn.sriov_vf->index}};
  if (fn.vgpu_vf) {
    json creatable = json::array();
    for (const auto& type : fn.vgpu_vf->creatable) {
      creatable.push_back({{"id", type.id}, {"name", type.name}});
    }
    entry["vgpuVf"] = {{"currentType", fn.vgpu_vf->current_type}, {"creatable", creatable}};
    for (const SelectedVgpuVf& vf : selection.vgpu_vfs) {
      if (vf.address != address) continue;
      json offered = json::array();
      for (const auto& type : vf.offered) offered.push_back(type.id);
      entry["vgpuVf"]["offered"] = offered;
    }
  }
  for (const SelectedDevice& device : selection.devices) {
    if (device.address == address) {
      entry["companions"] = device.companions;
      if (device.unsafe_no_iommu) entry["unsafeNoIommu"] = true;
    }
  }
  return entry;
}

json MdevParentsJson(const Inventory& inventory, const DeviceSelection& selection) {
  json parents = json::array();
  for (const MdevParent& parent : inventory.mdev_parents) {
    json types = json::array();
    for (const MdevType& type : parent.types) {
      json t = {{"id", type.id},
                {"name", type.name},
                {"description", type.description},
                {"deviceAPI", type.device_api},
                {"availableInstances", type.available_instances}};
      for (const MdevTypeDecision& d : selection.mdev_decisions) {
        if (d.parent == parent.name && d.type_id == type.id) {
          t["published"] = d.published;
          if (!d.reason.empty()) t["reason"] = d.reason;
        }
      }
      types.push_back(t);
    }
    json instances = json::array();
    for (const MdevInstance& instance : parent.instances) {
      instances.push_back(
          {{"uuid", instance.uuid},
           {"type", instance.type_id},
           {"iommuGroup", instance.iommu_group ? json(*instance.iommu_group) : json(nullptr)}});
    }
    parents.push_back({{"name", parent.name},
                       {"pciAddress", parent.pci_address},
                       {"types", types},
                       {"instances", instances}});
  }
  return parents;
}

json VgpuGpusJson(const DeviceSelection& selection) {
  json vgpu_gpus = json::array();
  for (const SelectedVgpuGpu& gpu : selection.vgpu_gpus) {
    json entry = {{"pf", gpu.pf}, {"state", gpu.state}};
    if (gpu.type_id != 0) {
      entry["offeredType"] = {{"id", gpu.type_id}, {"name", gpu.type_name}};
      entry["bound"] = gpu.bound;
      entry["boundSource"] = gpu.bound_source;
    }
    vgpu_gpus.push_back(std::move(entry));
  }
  return vgpu_gpus;
}

}  // namespace

nlohmann::json DiscoverJson(const Inventory& inventory, const DeviceSelection& selection,
                            const DiscoverContext& context) {
  json functions = json::array();
  for (const auto& [address, fn] : inventory.functions) {
    functions.push_back(FunctionJson(address, fn, selection));
  }
  json groups = json::array();
  for (const auto& [id, group] : inventory.iommu_groups) {
    groups.push_back({{"id", id}, {"members", group.members}});
  }
  return {{"sysfsRoot", context.sysfs_root},
          {"policy", context.policy_source},
          {"iommuEnabled", inventory.iommu_enabled},
          {"functions", functions},
          {"iommuGroups", groups},
          {"mdevParents", MdevParentsJson(inventory, selection)},
          {"vgpuGpus", VgpuGpusJson(selection)},
          {"warnings", inventory.warnings}};
}

}  // namespace vfio_dra::discovery
