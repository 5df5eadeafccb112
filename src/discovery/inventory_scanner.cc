#include "discovery/inventory_scanner.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <thread>

#include "sysfs/sysfs_parse.h"

namespace vfio_dra::discovery {
namespace {

Result<uint32_t> ReadHexFile(const sysfs::SysfsDir& dir, const std::string& name, int digits) {
  auto text = dir.Read(name);
  if (!text.ok()) return text.error();
  auto value = sysfs::ParseHexAttribute(*text, digits);
  if (!value.ok()) return value.error().Wrap(dir.Path(name));
  return value;
}

// An `iommu_group` link's group number; none when there is no link.
Result<std::optional<int>> GroupFromLink(const Result<std::string>& base_name,
                                         const std::string& path) {
  if (!base_name.ok()) {
    if (base_name.error().kind == ErrorKind::kNotFound) return std::optional<int>();
    return base_name.error();
  }
  auto number = sysfs::ParseDecimalAttribute(*base_name);
  if (!number.ok() || *number < 0 || *number > 1000000) {
    return MakeError(ErrorKind::kInvalidArgument,
                     path + ": link target is not an IOMMU group number");
  }
  return std::optional<int>(static_cast<int>(*number));
}

Result<std::optional<int>> ReadGroupLink(const sysfs::SysfsReader& sysfs, const std::string& path) {
  return GroupFromLink(sysfs.LinkBaseName(path), sysfs.Path(path));
}

// The signals device_conditions.h judges. Neither read takes the device lock.
void ReadHealthSignals(const sysfs::SysfsDir& dir, PciFunction& fn) {
  if (auto aer = dir.Read("aer_dev_fatal"); aer.ok()) {
    auto total = sysfs::ParseAerFatalTotal(*aer);
    if (total.ok()) {
      fn.aer_fatal_errors = *total;
    } else {
      fn.aer_unreadable = total.error().Wrap(dir.Path("aer_dev_fatal")).message;
    }
  } else if (aer.error().kind != ErrorKind::kNotFound) {
    fn.aer_unreadable = aer.error().message;
  }
  // Only a PF's link matters (its VFs' traffic goes through it), and only while it has VFs.
  if (!fn.sriov_pf.has_value() || fn.sriov_pf->num_vfs == 0 || fn.netdevs.empty()) return;
  fn.link_down = std::all_of(fn.netdevs.begin(), fn.netdevs.end(), [&](const std::string& netdev) {
    auto state = dir.Read("net/" + netdev + "/operstate");
    return state.ok() && sysfs::OperstateIsDown(*state);
  });
}

Result<PciFunction> ReadFunction(const sysfs::SysfsReader& sysfs, const std::string& entry,
                                 const std::string& address) {
  PciFunction fn;
  fn.address = address;
  const std::string link = "bus/pci/devices/" + entry;
  if (auto target = sysfs.ReadLink(link); target.ok()) {
    fn.pcie_root = sysfs::PcieRootFromPath(*target);
  }
  auto opened = sysfs.OpenDir(link);
  if (!opened.ok()) return opened.error();
  const sysfs::SysfsDir& dir = *opened;
  // IDs and class from `modalias` and the driver from its link, not from `uevent`: reading
  // `uevent` takes the kernel's device lock (since the fix of its race with driver detach), which
  // a process stuck unbinding the function holds until a VM lets go of it.
  auto modalias_text = dir.Read("modalias");
  if (!modalias_text.ok()) return modalias_text.error();
  auto modalias = sysfs::ParsePciModalias(*modalias_text);
  if (!modalias.ok()) return modalias.error().Wrap(dir.Path("modalias"));
  fn.vendor_id = modalias->vendor;
  fn.device_id = modalias->device;
  fn.subsystem_vendor_id = modalias->subsystem_vendor;
  fn.subsystem_device_id = modalias->subsystem_device;
  fn.class_code = modalias->class_code;
  fn.modalias = std::move(modalias->text);
  if (auto revision = ReadHexFile(dir, "revision", 2); revision.ok()) fn.revision = *revision;
  if (auto driver_link = dir.LinkBaseName("driver"); driver_link.ok()) {
    fn.driver = *driver_link;
  } else if (driver_link.error().kind != ErrorKind::kNotFound) {
    return driver_link.error();
  }
  // driver_override is left unread: only reports show it (`discover` reads it apart, bounded),
  // and its read takes the kernel's device lock.
  auto group = GroupFromLink(dir.LinkBaseName("iommu_group"), dir.Path("iommu_group"));
  if (!group.ok()) return group.error();
  fn.iommu_group = *group;
  if (auto numa_text = dir.Read("numa_node"); numa_text.ok()) {
    if (auto numa = sysfs::ParseDecimalAttribute(*numa_text); numa.ok() && *numa >= 0) {
      fn.numa_node = static_cast<int>(*numa);
    }
  }
  if (auto total = dir.Read("sriov_totalvfs"); total.ok()) {
    SriovPf pf;
    auto total_value = sysfs::ParseDecimalAttribute(*total);
    if (!total_value.ok()) return total_value.error().Wrap(dir.Path("sriov_totalvfs"));
    pf.total_vfs = static_cast<int>(*total_value);
    // The enabled VFs are counted by their virtfn<N> links, which the kernel adds and removes
    // with the VFs: reading sriov_numvfs takes the device lock, and would block every scan while
    // any process is stuck unbinding the PF.
    auto entries = dir.List(".");
    if (!entries.ok()) return entries.error().Wrap("cannot count the VFs of " + address);
    pf.num_vfs = static_cast<int>(
        std::count_if(entries->begin(), entries->end(), [](const std::string& name) {
          return name.size() > 6 && name.compare(0, 6, "virtfn") == 0 &&
                 std::all_of(name.begin() + 6, name.end(),
                             [](char c) { return c >= '0' && c <= '9'; });
        }));
    fn.sriov_pf = pf;
  }
  if (auto physfn = dir.LinkBaseName("physfn"); physfn.ok()) {
    auto pf = sysfs::CanonicalBdf(*physfn);
    if (!pf.ok()) return pf.error().Wrap(dir.Path("physfn"));
    fn.sriov_vf = SriovVf{*pf, -1};
  }
  if (auto net = dir.List("net"); net.ok()) fn.netdevs = *net;
  ReadHealthSignals(dir, fn);
  if (fn.sriov_vf.has_value()) {
    if (auto current = dir.Read("nvidia/current_vgpu_type"); current.ok()) {
      auto type = sysfs::ParseDecimalAttribute(*current);
      if (!type.ok() || *type < 0) {
        return MakeError(ErrorKind::kInvalidArgument,
                         dir.Path("nvidia/current_vgpu_type") + ": not a vGPU type ID");
      }
      auto listed = dir.Read("nvidia/creatable_vgpu_types");
      if (!listed.ok()) return listed.error();
      auto creatable = sysfs::ParseCreatableVgpuTypes(*listed);
      if (!creatable.ok()) return creatable.error().Wrap(dir.Path("nvidia"));
      fn.vgpu_vf = VgpuVf{static_cast<int>(*type), std::move(*creatable)};
    }
  }
  return fn;
}

void ScanMdevParents(const sysfs::SysfsReader& sysfs, Inventory& inventory) {
  auto parents = sysfs.List("class/mdev_bus");
  if (!parents.ok()) return;  // no mdev-capable driver loaded
  for (const std::string& name : *parents) {
    const std::string base = "class/mdev_bus/" + name;
    MdevParent parent;
    parent.name = name;
    if (auto bdf = sysfs::CanonicalBdf(name); bdf.ok() && inventory.functions.count(*bdf)) {
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
      auto count = sysfs::ParseDecimalAttribute(*available);
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
      type.stated_max_instances = sysfs::ParseMdevMaxInstance(type.description);
      parent.types.push_back(std::move(type));
    }
    if (auto entries = sysfs.List(base); entries.ok()) {
      for (const std::string& entry : *entries) {
        if (!sysfs::IsMdevUuid(entry)) continue;
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

Result<PciFunction> ReadPciFunction(const sysfs::SysfsReader& sysfs, const std::string& address) {
  if (!sysfs.Exists("bus/pci/devices/" + address)) {
    return MakeError(ErrorKind::kNotFound, "PCI device " + address + " is not present (no " +
                                               sysfs.Path("bus/pci/devices/" + address) + ")");
  }
  return ReadFunction(sysfs, address, address);
}

namespace {

// Reads every PCI function into the inventory; functions that cannot be read become warnings,
// and the IOMMU groups they belong to are returned (by address) so those groups count as in use.
// Reading a function is a dozen small syscalls and independent of every other function, so large
// nodes are read on several threads; results are merged in address order.
std::map<std::string, int> ReadFunctions(const sysfs::SysfsReader& sysfs, PciNames* names,
                                         Inventory& inventory) {
  std::map<std::string, int> unreadable_groups;
  auto entries = sysfs.List("bus/pci/devices");
  if (!entries.ok()) {
    inventory.warnings.push_back("no PCI devices: " + entries.error().message);
    return unreadable_groups;
  }
  const size_t count = entries->size();
  std::vector<std::optional<Result<PciFunction>>> read(count);
  std::vector<std::optional<std::string>> addresses(count);
  auto read_range = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      auto address = sysfs::CanonicalBdf((*entries)[i]);
      if (!address.ok()) {
        read[i] = address.error();
        continue;
      }
      addresses[i] = *address;
      read[i] = ReadFunction(sysfs, (*entries)[i], *address);
    }
  };
  const size_t threads =
      count < 256 ? 1 : std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
  std::vector<std::thread> workers;
  const size_t per_thread = (count + threads - 1) / threads;
  for (size_t t = 1; t < threads; ++t) {
    workers.emplace_back(read_range, std::min(count, t * per_thread),
                         std::min(count, (t + 1) * per_thread));
  }
  read_range(0, std::min(count, per_thread));
  for (auto& worker : workers) worker.join();

  for (size_t i = 0; i < count; ++i) {
    const std::string& entry = (*entries)[i];
    if (!addresses[i].has_value()) {
      inventory.warnings.push_back("skipping " + sysfs.Path("bus/pci/devices/" + entry) + ": " +
                                   read[i]->error().message);
      continue;
    }
    const std::string& address = *addresses[i];
    Result<PciFunction>& fn = *read[i];
    // The kernel takes a removed function off the bus listing before it removes its directory, so
    // a removal that overlaps the scan shows as a function listed and then not there. It is gone,
    // not unreadable: a claim's device on it is lost (device_taints.h). The warning stands, so the
    // next check scans again and sees the bus without it.
    if (!fn.ok() && !sysfs.Exists("bus/pci/devices/" + entry)) {
      inventory.warnings.push_back(
          "PCI function " + address +
          " went away while it was read (removed or hot-unplugged): " + fn.error().message);
      continue;
    }
    inventory.listed.push_back(address);
    if (!fn.ok()) {
      inventory.warnings.push_back("skipping PCI function " + address + ": " + fn.error().message);
      if (auto group = ReadGroupLink(sysfs, "bus/pci/devices/" + entry + "/iommu_group");
          group.ok() && group->has_value()) {
        unreadable_groups[address] = **group;
      }
      continue;
    }
    if (names != nullptr) {
      fn->vendor_name = names->VendorName(fn->vendor_id);
      fn->device_name = names->DeviceName(fn->vendor_id, fn->device_id);
    }
    inventory.functions.emplace(address, std::move(*fn));
  }
  return unreadable_groups;
}

// IOMMU groups from the functions' own links (the kernel's per-group listing says the same for
// PCI functions and would cost a directory read per group).
void CollectIommuGroups(const sysfs::SysfsReader& sysfs,
                        const std::map<std::string, int>& unreadable_groups, Inventory& inventory) {
  for (const auto& [address, fn] : inventory.functions) {
    if (!fn.iommu_group.has_value()) continue;
    IommuGroup& group = inventory.iommu_groups[*fn.iommu_group];
    group.id = *fn.iommu_group;
    group.members.push_back(address);  // functions are visited in address order
  }
  for (const auto& [address, group_id] : unreadable_groups) {
    IommuGroup& group = inventory.iommu_groups[group_id];
    group.id = group_id;
    group.unreadable_members.push_back(address);
  }
  if (auto groups = sysfs.List("kernel/iommu_groups"); groups.ok()) {
    inventory.iommu_enabled = !groups->empty();
  }
  inventory.iommu_enabled = inventory.iommu_enabled || !inventory.iommu_groups.empty();
}

// SR-IOV: VF indexes come from the PF's virtfnN links.
void LinkVirtualFunctions(const sysfs::SysfsReader& sysfs, Inventory& inventory) {
  for (auto& [address, fn] : inventory.functions) {
    if (!fn.sriov_pf.has_value()) continue;
    auto links = sysfs.List("bus/pci/devices/" + address);
    if (!links.ok()) continue;
    std::map<int, std::string> by_index;
    for (const std::string& link : *links) {
      if (link.rfind("virtfn", 0) != 0) continue;
      auto index = sysfs::ParseDecimalAttribute(link.substr(6));
      auto target = sysfs.LinkBaseName("bus/pci/devices/" + address + "/" + link);
      if (!index.ok() || !target.ok()) continue;
      auto vf = sysfs::CanonicalBdf(*target);
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
}

}  // namespace

Inventory ScanInventory(const sysfs::SysfsReader& sysfs, PciNames* names) {
  Inventory inventory;
  const auto unreadable_groups = ReadFunctions(sysfs, names, inventory);
  CollectIommuGroups(sysfs, unreadable_groups, inventory);
  LinkVirtualFunctions(sysfs, inventory);
  ScanMdevParents(sysfs, inventory);
  std::sort(inventory.listed.begin(), inventory.listed.end());
  return inventory;
}

}  // namespace vfio_dra::discovery
