#include "discovery/inventory_scanner.h"

#include <algorithm>
#include <set>

#include "discovery/sysfs_parse.h"

namespace vfio_dra::discovery {
namespace {

// Parses "VVVV:DDDD" (uevent PCI_ID / PCI_SUBSYS_ID).
bool ParseIdPair(const std::string& text, uint32_t& first, uint32_t& second) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  auto a = ParseBareHex(text.substr(0, colon), 4);
  auto b = ParseBareHex(text.substr(colon + 1), 4);
  if (!a.ok() || !b.ok()) return false;
  first = *a;
  second = *b;
  return true;
}

Result<uint32_t> ReadHexFile(const SysfsReader& sysfs, const std::string& path, int digits) {
  auto text = sysfs.Read(path);
  if (!text.ok()) return text.error();
  auto value = ParseHexAttribute(*text, digits);
  if (!value.ok()) return value.error().Wrap(sysfs.Path(path));
  return value;
}

Result<std::optional<int>> ReadGroupLink(const SysfsReader& sysfs, const std::string& path) {
  auto group = sysfs.LinkBaseName(path);
  if (!group.ok()) {
    if (group.error().kind == ErrorKind::kNotFound) return std::optional<int>();
    return group.error();
  }
  auto number = ParseDecimalAttribute(*group);
  if (!number.ok() || *number < 0 || *number > 1000000) {
    return MakeError(ErrorKind::kInvalidArgument,
                     sysfs.Path(path) + ": link target is not an IOMMU group number");
  }
  return std::optional<int>(static_cast<int>(*number));
}

Result<PciFunction> ReadFunction(const SysfsReader& sysfs, const std::string& base,
                                 const std::string& address) {
  PciFunction fn;
  fn.address = address;
  auto uevent_text = sysfs.Read(base + "/uevent");
  if (!uevent_text.ok()) return uevent_text.error();
  auto uevent = ParseUevent(*uevent_text);
  if (!uevent.ok()) return uevent.error().Wrap(sysfs.Path(base + "/uevent"));

  // IDs and class come from uevent (one read); the individual files are the fallback.
  if (auto id = uevent->find("PCI_ID");
      id == uevent->end() || !ParseIdPair(id->second, fn.vendor_id, fn.device_id)) {
    auto vendor = ReadHexFile(sysfs, base + "/vendor", 4);
    if (!vendor.ok()) return vendor.error();
    auto device = ReadHexFile(sysfs, base + "/device", 4);
    if (!device.ok()) return device.error();
    fn.vendor_id = *vendor;
    fn.device_id = *device;
  }
  if (auto sub = uevent->find("PCI_SUBSYS_ID"); sub != uevent->end()) {
    ParseIdPair(sub->second, fn.subsystem_vendor_id, fn.subsystem_device_id);
  }
  if (auto cls = uevent->find("PCI_CLASS"); cls != uevent->end() && ParseBareHex(cls->second, 6)) {
    fn.class_code = *ParseBareHex(cls->second, 6);
  } else {
    auto cls_file = ReadHexFile(sysfs, base + "/class", 6);
    if (!cls_file.ok()) return cls_file.error();
    fn.class_code = *cls_file;
  }
  if (auto revision = ReadHexFile(sysfs, base + "/revision", 2); revision.ok()) {
    fn.revision = *revision;
  }
  if (auto driver = uevent->find("DRIVER"); driver != uevent->end()) {
    fn.driver = driver->second;
  } else if (auto link = sysfs.LinkBaseName(base + "/driver"); link.ok()) {
    fn.driver = *link;
  }
  if (auto override_text = sysfs.Read(base + "/driver_override"); override_text.ok()) {
    fn.driver_override = ParseDriverOverride(*override_text);
  }
  auto group = ReadGroupLink(sysfs, base + "/iommu_group");
  if (!group.ok()) return group.error();
  fn.iommu_group = *group;
  if (auto numa_text = sysfs.Read(base + "/numa_node"); numa_text.ok()) {
    if (auto numa = ParseDecimalAttribute(*numa_text); numa.ok() && *numa >= 0) {
      fn.numa_node = static_cast<int>(*numa);
    }
  }
  if (auto real = sysfs.RealPath(base); real.ok()) {
    // devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0 -> pci0000:3a
    const std::string& path = *real;
    const size_t start = path.rfind("devices/", 0) == 0 ? 8 : std::string::npos;
    if (start != std::string::npos) {
      const std::string root = path.substr(start, path.find('/', start) - start);
      if (root.rfind("pci", 0) == 0) fn.pcie_root = root;
    }
  }
  if (sysfs.Exists(base + "/sriov_totalvfs")) {
    SriovPf pf;
    if (auto total = sysfs.Read(base + "/sriov_totalvfs"); total.ok()) {
      auto value = ParseDecimalAttribute(*total);
      if (!value.ok()) return value.error().Wrap(sysfs.Path(base + "/sriov_totalvfs"));
      pf.total_vfs = static_cast<int>(*value);
    }
    if (auto num = sysfs.Read(base + "/sriov_numvfs"); num.ok()) {
      auto value = ParseDecimalAttribute(*num);
      if (!value.ok()) return value.error().Wrap(sysfs.Path(base + "/sriov_numvfs"));
      pf.num_vfs = static_cast<int>(*value);
    }
    fn.sriov_pf = pf;
  }
  if (auto physfn = sysfs.LinkBaseName(base + "/physfn"); physfn.ok()) {
    auto pf = CanonicalBdf(*physfn);
    if (!pf.ok()) return pf.error().Wrap(sysfs.Path(base + "/physfn"));
    fn.sriov_vf = SriovVf{*pf, -1};
  }
  if (auto net = sysfs.List(base + "/net"); net.ok()) fn.netdevs = *net;
  return fn;
}

void ScanMdevParents(const SysfsReader& sysfs, Inventory& inventory) {
  auto parents = sysfs.List("class/mdev_bus");
  if (!parents.ok()) return;  // no mdev-capable driver loaded
  for (const std::string& name : *parents) {
    const std::string base = "class/mdev_bus/" + name;
    MdevParent parent;
    parent.name = name;
    if (auto bdf = CanonicalBdf(name); bdf.ok() && inventory.functions.count(*bdf)) {
      parent.pci_address = *bdf;
    }
    auto types = sysfs.List(base + "/mdev_supported_types");
    if (!types.ok()) {
      inventory.warnings.push_back("skipping mdev parent " + name + ": " + types.error().message);
      continue;
    }
    for (const std::string& type_id : *types) {
      const std::string dir = base + "/mdev_supported_types/" + type_id;
      MdevType type;
      type.id = type_id;
      auto api = sysfs.Read(dir + "/device_api");
      auto available = sysfs.Read(dir + "/available_instances");
      if (!api.ok() || !available.ok()) {
        inventory.warnings.push_back("skipping mdev type " + type_id + " of " + name + ": " +
                                     (!api.ok() ? api.error() : available.error()).message);
        continue;
      }
      auto count = ParseDecimalAttribute(*available);
      if (!count.ok() || *count < 0) {
        inventory.warnings.push_back("skipping mdev type " + type_id + " of " + name + ": " +
                                     sysfs.Path(dir + "/available_instances") + ": not a count");
        continue;
      }
      auto trim = [](std::string text) {
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
        return text;
      };
      type.device_api = trim(*api);
      type.available_instances = static_cast<int>(*count);
      if (auto n = sysfs.Read(dir + "/name"); n.ok()) type.name = trim(*n);
      if (auto d = sysfs.Read(dir + "/description"); d.ok()) type.description = trim(*d);
      parent.types.push_back(std::move(type));
    }
    if (auto entries = sysfs.List(base); entries.ok()) {
      for (const std::string& entry : *entries) {
        if (!IsMdevUuid(entry)) continue;
        MdevInstance instance;
        instance.uuid = entry;
        auto type = sysfs.LinkBaseName(base + "/" + entry + "/mdev_type");
        if (!type.ok()) {
          inventory.warnings.push_back("skipping mdev " + entry + " of " + name + ": " +
                                       type.error().message);
          continue;
        }
        instance.type_id = *type;
        if (auto group = ReadGroupLink(sysfs, base + "/" + entry + "/iommu_group"); group.ok()) {
          instance.iommu_group = *group;
        }
        parent.instances.push_back(std::move(instance));
      }
    }
    inventory.mdev_parents.push_back(std::move(parent));
  }
}

}  // namespace

Inventory ScanInventory(const SysfsReader& sysfs, PciNames* names) {
  Inventory inventory;
  auto entries = sysfs.List("bus/pci/devices");
  if (!entries.ok()) {
    inventory.warnings.push_back("no PCI devices: " + entries.error().message);
  } else {
    for (const std::string& entry : *entries) {
      auto address = CanonicalBdf(entry);
      if (!address.ok()) {
        inventory.warnings.push_back("skipping " + sysfs.Path("bus/pci/devices/" + entry) + ": " +
                                     address.error().message);
        continue;
      }
      auto fn = ReadFunction(sysfs, "bus/pci/devices/" + entry, *address);
      if (!fn.ok()) {
        inventory.warnings.push_back("skipping PCI function " + *address + ": " +
                                     fn.error().message);
        continue;
      }
      if (names != nullptr) {
        fn->vendor_name = names->VendorName(fn->vendor_id);
        fn->device_name = names->DeviceName(fn->vendor_id, fn->device_id);
      }
      inventory.functions.emplace(*address, std::move(*fn));
    }
  }

  // IOMMU groups as the kernel lists them, completed by the functions' own links.
  if (auto groups = sysfs.List("kernel/iommu_groups"); groups.ok()) {
    for (const std::string& entry : *groups) {
      auto id = ParseDecimalAttribute(entry);
      if (!id.ok() || *id < 0) continue;
      IommuGroup group;
      group.id = static_cast<int>(*id);
      if (auto members = sysfs.List("kernel/iommu_groups/" + entry + "/devices"); members.ok()) {
        for (const std::string& member : *members) {
          if (auto bdf = CanonicalBdf(member); bdf.ok()) group.members.push_back(*bdf);
        }
      }
      inventory.iommu_groups[group.id] = std::move(group);
    }
  }
  inventory.iommu_enabled = !inventory.iommu_groups.empty();
  for (const auto& [address, fn] : inventory.functions) {
    if (!fn.iommu_group.has_value()) continue;
    IommuGroup& group = inventory.iommu_groups[*fn.iommu_group];
    group.id = *fn.iommu_group;
    if (std::find(group.members.begin(), group.members.end(), address) == group.members.end()) {
      group.members.push_back(address);
      std::sort(group.members.begin(), group.members.end());
    }
  }
  inventory.iommu_enabled = !inventory.iommu_groups.empty();

  // SR-IOV: VF indexes come from the PF's virtfnN links.
  for (auto& [address, fn] : inventory.functions) {
    if (!fn.sriov_pf.has_value()) continue;
    auto links = sysfs.List("bus/pci/devices/" + address);
    if (!links.ok()) continue;
    std::map<int, std::string> by_index;
    for (const std::string& link : *links) {
      if (link.rfind("virtfn", 0) != 0) continue;
      auto index = ParseDecimalAttribute(link.substr(6));
      auto target = sysfs.LinkBaseName("bus/pci/devices/" + address + "/" + link);
      if (!index.ok() || !target.ok()) continue;
      auto vf = CanonicalBdf(*target);
      if (!vf.ok()) continue;
      by_index[static_cast<int>(*index)] = *vf;
    }
    for (const auto& [index, vf] : by_index) {
      fn.sriov_pf->vfs.push_back(vf);
      auto it = inventory.functions.find(vf);
      if (it != inventory.functions.end() && it->second.sriov_vf.has_value()) {
        it->second.sriov_vf->index = index;
      }
    }
  }

  ScanMdevParents(sysfs, inventory);
  return inventory;
}

}  // namespace vfio_dra::discovery
