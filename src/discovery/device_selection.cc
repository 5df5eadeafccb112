#include "discovery/device_selection.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "discovery/vfio_driver_choice.h"
#include "discovery/vgpu_selection.h"

namespace vfio_dra::discovery {
namespace {

bool IsGpuClass(uint32_t class_and_subclass) {
  return class_and_subclass == 0x0300 || class_and_subclass == 0x0302;
}

// Functions that ride along with a GPU on its slot: HDA audio, USB and UCSI (serial bus).
bool IsGpuCompanionClass(uint32_t class_and_subclass) {
  return class_and_subclass == 0x0403 || class_and_subclass == 0x0c03 ||
         class_and_subclass == 0x0c80;
}

const DeviceSelector* FirstMatch(const std::vector<DeviceSelector>& selectors,
                                 const PciFunction& fn, std::optional<DeviceKind> kind) {
  for (const DeviceSelector& s : selectors) {
    if (s.kind.has_value() && kind.has_value() && *s.kind != *kind) continue;
    if (s.MatchesFunction(fn)) return &s;
  }
  return nullptr;
}

// What a function would be published as, before policy and safety rules.
DeviceKind KindOf(const PciFunction& fn, const AdminPolicy& policy) {
  if (fn.vgpu_vf.has_value()) return DeviceKind::kVgpu;
  if (fn.sriov_vf.has_value()) return DeviceKind::kVf;
  if (IsGpuClass(fn.ClassAndSubclass())) return DeviceKind::kGpu;
  if (fn.ClassAndSubclass() == 0x0380 &&
      FirstMatch(policy.select, fn, DeviceKind::kGpu) != nullptr) {
    return DeviceKind::kGpu;
  }
  return DeviceKind::kHostdev;
}

std::string DriverText(const PciFunction& fn) {
  return fn.driver.empty() ? "no driver" : "driver " + fn.driver;
}

// Phase 1: a function on its own (kind, policy, and the rules that need no group context). True
// when it is a candidate for publication.
bool JudgeFunction(const Inventory& inventory, const AdminPolicy& policy, const PciFunction& fn,
                   FunctionDecision& decision) {
  if (fn.IsBridge()) {
    decision.reason = "bridge: never managed";
    return false;
  }
  const DeviceKind kind = KindOf(fn, policy);
  decision.kind = kind;
  if (kind == DeviceKind::kVgpu) return false;  // SelectVgpus judges it
  const char* kind_name = DeviceKindName(kind);
  if (!policy.KindEnabled(kind)) {
    decision.reason =
        fmt::format("kind {} is turned off by the policy ({})", kind_name, policy.source);
    return false;
  }
  if (const DeviceSelector* denied = FirstMatch(policy.deny, fn, std::nullopt)) {
    decision.reason = "denied by the policy (" + denied->where + ")";
    return false;
  }
  if (fn.address.find(':') > 4) {
    // Behind a VMD controller the kernel invents a domain beyond 16 bits: such devices share
    // the controller's DMA identity and have no standard pciBusID form.
    decision.reason = "behind a VMD controller (PCI domain " +
                      fn.address.substr(0, fn.address.find(':')) +
                      "): shares the controller's DMA identity; never managed";
    return false;
  }
  if (fn.sriov_pf.has_value() && fn.sriov_pf->num_vfs > 0) {
    decision.reason = fmt::format("SR-IOV PF with {} VFs enabled: its VFs are managed instead",
                                  fn.sriov_pf->num_vfs);
    return false;
  }
  bool selected = false;
  switch (kind) {
    case DeviceKind::kGpu:
      selected = !policy.HasSelectorsFor(DeviceKind::kGpu) ||
                 FirstMatch(policy.select, fn, DeviceKind::kGpu) != nullptr;
      if (!selected) decision.reason = "no gpu selector of the policy matches";
      break;
    case DeviceKind::kVf:
      if (policy.HasSelectorsFor(DeviceKind::kVf)) {
        selected = FirstMatch(policy.select, fn, DeviceKind::kVf) != nullptr;
        if (!selected) decision.reason = "no vf selector of the policy matches";
      } else {
        selected = fn.BaseClass() == 0x02 && IsKnownNicVendor(fn.vendor_id);
        if (!selected) {
          decision.reason = fmt::format(
              "VF of vendor {:04x} class {:04x} is not a known NIC VF; publish it with a vf "
              "selector",
              fn.vendor_id, fn.ClassAndSubclass());
        }
      }
      break;
    case DeviceKind::kHostdev:
      selected = FirstMatch(policy.select, fn, DeviceKind::kHostdev) != nullptr;
      if (!selected) {
        decision.reason = "host devices are published only when a hostdev selector matches";
      }
      break;
    case DeviceKind::kMdev:
    case DeviceKind::kVgpu:
      break;
  }
  if (!selected) return false;
  if (!fn.iommu_group.has_value() && !policy.unsafe_no_iommu) {
    decision.reason = inventory.iommu_enabled
                          ? "no IOMMU group"
                          : "no IOMMU group: the IOMMU is off (boot with intel_iommu=on or "
                            "amd_iommu=on; unsafeNoIommu in the policy overrides, unsafely)";
    return false;
  }
  return true;
}

// Phase 2: GPU companions on the same slot and group belong to their GPU: they leave the
// candidates and are bound with it. Returns the companions by GPU address.
std::map<std::string, std::vector<std::string>> AttachCompanions(const Inventory& inventory,
                                                                 const AdminPolicy& policy,
                                                                 std::set<std::string>& candidates,
                                                                 DeviceSelection& selection) {
  std::map<std::string, std::vector<std::string>> companions;
  std::set<std::string> companion_set;
  for (const std::string& address : candidates) {
    const PciFunction& gpu = inventory.functions.at(address);
    if (KindOf(gpu, policy) != DeviceKind::kGpu || !gpu.iommu_group.has_value()) continue;
    for (const std::string& member : inventory.iommu_groups.at(*gpu.iommu_group).members) {
      const PciFunction* fn = inventory.Find(member);
      if (fn == nullptr || member == address || fn->Slot() != gpu.Slot() || fn->IsBridge() ||
          !IsGpuCompanionClass(fn->ClassAndSubclass())) {
        continue;
      }
      companions[address].push_back(member);
      companion_set.insert(member);
      FunctionDecision& decision = selection.functions[member];
      decision.published = false;
      decision.reason = "companion of GPU " + address + ": bound to vfio-pci with it";
    }
  }
  for (const std::string& c : companion_set) candidates.erase(c);

  return companions;
}

// Phase 3: per IOMMU group, one published device, and no endpoint left that the host uses.
void SelectPerGroup(const Inventory& inventory, const std::set<std::string>& candidates,
                    std::map<std::string, std::vector<std::string>>& companions,
                    DeviceSelection& selection) {
  std::map<int, std::vector<std::string>> by_group;
  for (const std::string& address : candidates) {
    const PciFunction& fn = inventory.functions.at(address);
    if (fn.iommu_group.has_value()) {
      by_group[*fn.iommu_group].push_back(address);
    } else {
      SelectedDevice device{*selection.functions[address].kind, address, {}, true};
      selection.functions[address].published = true;
      selection.functions[address].reason =
          "UNSAFE: no IOMMU group, published because the policy sets unsafeNoIommu";
      selection.devices.push_back(device);
    }
  }
  for (auto& [group_id, members] : by_group) {
    std::sort(members.begin(), members.end());
    const std::string& primary = members.front();
    std::vector<std::string> bound = companions[primary];
    for (size_t i = 1; i < members.size(); ++i) {
      bound.push_back(members[i]);
      for (const std::string& c : companions[members[i]]) bound.push_back(c);
    }
    std::set<std::string> managed(bound.begin(), bound.end());
    managed.insert(primary);
    std::string blocker;
    const IommuGroup& group = inventory.iommu_groups.at(group_id);
    if (!group.unreadable_members.empty()) {
      blocker = fmt::format(
          "IOMMU group {} also holds {}, whose sysfs entry could not be read; it is treated as in "
          "use",
          group_id, group.unreadable_members.front());
    }
    for (const std::string& member : group.members) {
      if (!blocker.empty()) break;
      const PciFunction* fn = inventory.Find(member);
      if (fn == nullptr || managed.count(member) || fn->IsBridge() || fn->driver.empty()) {
        continue;
      }
      blocker = fmt::format(
          "IOMMU group {} also holds {} ({}{}), which {}; binding the group would take it away",
          group_id, member, fn->device_name.empty() ? "" : fn->device_name + ", ", DriverText(*fn),
          IsVfioDriverFor(*fn, fn->driver)
              ? "is bound to " + fn->driver + " outside vfio-dra"
              : std::string("the host uses and vfio-dra does not manage"));
      break;
    }
    if (!blocker.empty()) {
      for (const std::string& address : managed) {
        selection.functions[address].published = false;
        selection.functions[address].reason = blocker;
        selection.functions[address].group_unsafe = true;
      }
      continue;
    }
    for (size_t i = 1; i < members.size(); ++i) {
      selection.functions[members[i]].reason = fmt::format(
          "shares IOMMU group {} with {}: published as one device with it", group_id, primary);
    }
    std::sort(bound.begin(), bound.end());
    selection.functions[primary].published = true;
    selection.functions[primary].reason.clear();
    selection.devices.push_back(
        SelectedDevice{*selection.functions[primary].kind, primary, bound, false});
  }
  std::sort(selection.devices.begin(), selection.devices.end(),
            [](const SelectedDevice& a, const SelectedDevice& b) { return a.address < b.address; });
}

// Phase 4: mediated device types.
void SelectMdevTypes(const Inventory& inventory, const AdminPolicy& policy,
                     DeviceSelection& selection) {
  for (const MdevParent& parent : inventory.mdev_parents) {
    const PciFunction* parent_fn =
        parent.pci_address.empty() ? nullptr : inventory.Find(parent.pci_address);
    for (const MdevType& type : parent.types) {
      MdevTypeDecision decision{parent.name, type.id, false, ""};
      const DeviceSelector* denied = nullptr;
      for (const DeviceSelector& s : policy.deny) {
        if (s.kind.has_value() && *s.kind != DeviceKind::kMdev) continue;
        const bool matches = !s.mdev_types.empty()
                                 ? s.MatchesMdev(type.id, parent_fn)
                                 : parent_fn != nullptr && s.MatchesFunction(*parent_fn);
        if (matches) {
          denied = &s;
          break;
        }
      }
      if (!policy.mdev_enabled) {
        decision.reason = "kind mdev is turned off by the policy (" + policy.source + ")";
      } else if (denied != nullptr) {
        decision.reason = "denied by the policy (" + denied->where + ")";
      } else if (type.device_api != "vfio-pci") {
        decision.reason = "device_api is " + type.device_api + ", not vfio-pci";
      } else if (policy.HasSelectorsFor(DeviceKind::kMdev) &&
                 std::none_of(
                     policy.select.begin(), policy.select.end(), [&](const DeviceSelector& s) {
                       return s.kind == DeviceKind::kMdev && s.MatchesMdev(type.id, parent_fn);
                     })) {
        decision.reason = "no mdev selector of the policy matches";
      } else {
        decision.published = true;
        selection.mdev_types.push_back(SelectedMdevType{parent.name, type.id});
      }
      selection.mdev_decisions.push_back(decision);
    }
  }
}

}  // namespace

bool IsKnownNicVendor(uint32_t vendor_id) {
  static const std::set<uint32_t> kVendors = {
      0x8086,  // Intel
      0x15b3,  // Mellanox / NVIDIA networking
      0x14e4,  // Broadcom
      0x1077,  // QLogic / Marvell
      0x1425,  // Chelsio
      0x1924,  // Solarflare / AMD
      0x177d,  // Cavium / Marvell
      0x19e5,  // Huawei
      0x1dd8,  // Pensando / AMD
      0x19ee,  // Netronome
  };
  return kVendors.count(vendor_id) > 0;
}

DeviceSelection SelectDevices(const Inventory& inventory, const AdminPolicy& policy,
                              const VgpuGpuSizes& vgpu_sizes) {
  DeviceSelection selection;
  std::set<std::string> candidates;
  for (const auto& [address, fn] : inventory.functions) {
    if (JudgeFunction(inventory, policy, fn, selection.functions[address])) {
      candidates.insert(address);
    }
  }
  auto companions = AttachCompanions(inventory, policy, candidates, selection);
  SelectPerGroup(inventory, candidates, companions, selection);
  SelectMdevTypes(inventory, policy, selection);
  SelectVgpus(inventory, policy, vgpu_sizes, selection);
  return selection;
}

}  // namespace vfio_dra::discovery
