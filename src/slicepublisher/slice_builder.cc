#include "slicepublisher/slice_builder.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "slicepublisher/device_attributes.h"
#include "slicepublisher/device_names.h"
#include "slicepublisher/mdev_counters.h"

namespace vfio_dra::slicepublisher {
namespace {

using discovery::MdevParent;
using discovery::PciFunction;

// Cuts at a UTF-8 character boundary so the value stays valid text.
std::string Truncate(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return text.substr(0, cut);
}

std::string Hex4(uint32_t value) {
  static const char* digits = "0123456789abcdef";
  std::string out(4, '0');
  for (int i = 3; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = digits[value & 0xf];
  return out;
}

void AddTopology(SliceDevice& device, const PciFunction& fn) {
  if (!fn.pcie_root.empty()) device.attributes[attribute::kPcieRoot] = fn.pcie_root;
  if (fn.numa_node) device.attributes[attribute::kNumaNode] = int64_t{*fn.numa_node};
}

SliceDevice PciDevice(const discovery::SelectedDevice& selected, const PciFunction& fn) {
  SliceDevice device;
  device.name = PciDeviceName(selected.kind, selected.address);
  auto& a = device.attributes;
  a[attribute::kPciBusId] = fn.address;
  AddTopology(device, fn);
  a[attribute::kType] = std::string(discovery::DeviceKindName(selected.kind));
  a[attribute::kVendorId] = Hex4(fn.vendor_id);
  a[attribute::kDeviceId] = Hex4(fn.device_id);
  const std::string product = !fn.device_name.empty() ? fn.device_name : fn.vendor_name;
  if (!product.empty()) a[attribute::kProductName] = Truncate(product, kMaxStringAttribute);
  if (fn.iommu_group) a[attribute::kIommuGroup] = int64_t{*fn.iommu_group};
  if (!fn.driver.empty()) a[attribute::kHostDriver] = Truncate(fn.driver, kMaxStringAttribute);
  a[attribute::kVfioDriver] = Truncate(fn.vfio_driver.driver, kMaxStringAttribute);
  if (selected.unsafe_no_iommu) a[attribute::kUnsafeNoIommu] = true;
  if (fn.sriov_vf) {
    a[attribute::kPfPciAddress] = fn.sriov_vf->pf;
    if (fn.sriov_vf->index >= 0) a[attribute::kVfIndex] = int64_t{fn.sriov_vf->index};
  }
  if (!fn.netdevs.empty()) {
    a[attribute::kNetdev] = Truncate(fn.netdevs.front(), kMaxStringAttribute);
  }
  return device;
}

// A function a claim holds is on its VFIO driver, where it has no netdev: it keeps the netdev it
// was published with (as the scan shows it on its driver from before), so that a prepare and an
// unprepare of a network VF do not each rewrite its slice (issue 58: two writes per claim on a
// node, for a device nobody can allocate meanwhile anyway).
void KeepPublishedNetdev(SliceDevice& device, const PackedDeviceTable* table) {
  device.attributes.erase(attribute::kNetdev);
  if (table == nullptr) return;
  const std::optional<SliceDevice> published = table->Find(device.name);
  if (!published) return;
  if (auto it = published->attributes.find(attribute::kNetdev); it != published->attributes.end()) {
    device.attributes[attribute::kNetdev] = it->second;
  }
}

struct ParentGroup {
  std::string counter_set;  // empty: no counters for this parent
  std::vector<SliceDevice> devices;
  int64_t capacity = 0;
};

SliceDevice MdevDevice(const std::string& name, const std::string& uuid,
                       const discovery::MdevType& type, const MdevParent& parent,
                       const PciFunction* parent_fn, std::optional<int> iommu_group) {
  SliceDevice device;
  device.name = name;
  auto& a = device.attributes;
  a[attribute::kType] = std::string(kMdevDeviceType);
  a[attribute::kMdevUuid] = uuid;
  a[attribute::kMdevType] = Truncate(type.id, kMaxStringAttribute);
  if (!type.name.empty()) a[attribute::kProductName] = Truncate(type.name, kMaxStringAttribute);
  a[attribute::kMdevParent] = Truncate(parent.name, kMaxStringAttribute);
  if (parent_fn != nullptr) {
    a[attribute::kParentPciAddress] = parent_fn->address;
    a[attribute::kVendorId] = Hex4(parent_fn->vendor_id);
    a[attribute::kDeviceId] = Hex4(parent_fn->device_id);
    AddTopology(device, *parent_fn);
  }
  if (iommu_group) a[attribute::kIommuGroup] = int64_t{*iommu_group};
  return device;
}

// A vGPU on an NVIDIA vGPU VF: the VF is what the VM gets (its pciBusID), the PF its parent.
SliceDevice VgpuDevice(const PciFunction& vf, int type_id, const std::string& type_name) {
  SliceDevice device;
  device.name = VgpuDeviceName(vf.address, type_id);
  auto& a = device.attributes;
  a[attribute::kType] = std::string(kVgpuDeviceType);
  a[attribute::kPciBusId] = vf.address;
  AddTopology(device, vf);
  a[attribute::kVgpuTypeId] = int64_t{type_id};
  if (!type_name.empty()) {
    a[attribute::kVgpuTypeName] = Truncate(type_name, kMaxStringAttribute);
    a[attribute::kProductName] = Truncate(type_name, kMaxStringAttribute);
  }
  a[attribute::kVendorId] = Hex4(vf.vendor_id);
  a[attribute::kDeviceId] = Hex4(vf.device_id);
  if (vf.iommu_group) a[attribute::kIommuGroup] = int64_t{*vf.iommu_group};
  if (!vf.driver.empty()) a[attribute::kHostDriver] = Truncate(vf.driver, kMaxStringAttribute);
  if (vf.sriov_vf) {
    a[attribute::kParentPciAddress] = vf.sriov_vf->pf;
    if (vf.sriov_vf->index >= 0) a[attribute::kVfIndex] = int64_t{vf.sriov_vf->index};
  }
  return device;
}

// How many devices without counters share a slice: fewer once one of them is tainted (1.35+).
// The whole list is packed to the smaller limit then, so a taint coming or going on a node with
// more than 64 such devices moves devices between slices; below that it changes nothing.
size_t PlainLimit(const std::vector<SliceDevice>& plain, const BuildOptions& options) {
  const bool tainted = std::any_of(
      plain.begin(), plain.end(), [](const SliceDevice& device) { return !device.taints.empty(); });
  return tainted && options.small_advanced_slices ? kMaxDevicesPerSliceWithCounters
                                                  : kMaxDevicesPerSlice;
}

// Splits `devices` into chunks of at most `limit`.
void Chunk(std::vector<SliceDevice> devices, size_t limit, std::vector<SliceContent>& out) {
  for (size_t i = 0; i < devices.size(); i += limit) {
    SliceContent slice;
    slice.devices.assign(
        devices.begin() + static_cast<std::ptrdiff_t>(i),
        devices.begin() + static_cast<std::ptrdiff_t>(std::min(devices.size(), i + limit)));
    out.push_back(std::move(slice));
  }
}

// One partitionable parent: its counter set (mdev_counters.h), the whole-device entry (when the
// parent is a published PCI function), the instances that exist and the potential ones.
ParentGroup BuildParentGroup(const MdevParent& parent, const PciFunction* parent_fn,
                             std::optional<SliceDevice> whole,
                             const std::set<std::pair<std::string, std::string>>& published_types,
                             const BuildOptions& options, const MdevTypeMaxima& maxima,
                             std::vector<std::string>& warnings) {
  const bool counters = options.layout != CounterLayout::kNone;
  const MdevCounterPlan plan = PlanMdevCounters(parent, maxima);
  if (!plan.problem.empty()) {
    warnings.push_back("mdev parent " + parent.name + ": " + plan.problem +
                       "; only its existing instances are published");
  }
  ParentGroup group;
  if (counters) {
    group.counter_set = CounterSetName(parent.name, parent_fn != nullptr);
    group.capacity = plan.capacity;
  }
  if (whole) {
    if (counters) {
      whole->consumes_counters.push_back(
          {group.counter_set, {{kCapacityCounter, plan.whole_consumes}}});
    }
    group.devices.push_back(std::move(*whole));
  }
  std::map<std::string, std::optional<int>> existing;  // uuid -> IOMMU group
  for (const auto& instance : parent.instances) existing[instance.uuid] = instance.iommu_group;
  for (const auto& type : parent.types) {
    if (!published_types.count({parent.name, type.id})) continue;
    const MdevTypeCounters& numbers = plan.types.at(type.id);
    std::set<std::string> ours;
    for (int i = 0; i < numbers.names; ++i) {
      ours.insert(MdevInstanceUuid(options.node_name, parent.name, type.id, i));
    }
    int foreign = 0;
    for (const auto& instance : parent.instances) {
      if (instance.type_id != type.id || ours.count(instance.uuid)) continue;
      ++foreign;
      group.devices.push_back(MdevDevice(ForeignMdevDeviceName(instance.uuid), instance.uuid, type,
                                         parent, parent_fn, instance.iommu_group));
    }
    // Existing instances of ours keep their names; potential ones are offered only as far as
    // the kernel can still create them (without counters, not at all).
    int offered = 0;
    for (int i = 0; i < numbers.names - foreign; ++i) {
      const std::string uuid = MdevInstanceUuid(options.node_name, parent.name, type.id, i);
      auto it = existing.find(uuid);
      if (it == existing.end() &&
          (!counters || offered >= numbers.offerable || numbers.consumes <= 0)) {
        continue;
      }
      SliceDevice device = MdevDevice(MdevDeviceName(parent.name, type.id, i), uuid, type, parent,
                                      parent_fn, it == existing.end() ? std::nullopt : it->second);
      if (it == existing.end()) {
        ++offered;
        device.consumes_counters.push_back(
            {group.counter_set, {{kCapacityCounter, numbers.consumes}}});
      }
      group.devices.push_back(std::move(device));
    }
  }
  return group;
}

// NVIDIA vGPU VFs. A GPU that offers a type created at prepare (SelectedVgpuGpu) gets one
// counter set with its bound as capacity, and every vGPU of that type on it consumes 1: the
// offered ones and the existing ones alike, so a device consumes the same whether its vGPU exists
// or not, and a republish never changes an allocated device's consumption. Other existing vGPUs
// are published without counters (there is no choice left). Without counters nothing new is
// offered, since nothing would bound the GPU.
void AddVgpuVfs(const discovery::NodeScan& scan, const BuildOptions& options,
                std::vector<ParentGroup>& groups, std::vector<SliceDevice>& plain) {
  const bool counters = options.layout != CounterLayout::kNone;
  std::map<std::string, size_t> group_of;  // PF -> index in `groups`
  std::map<std::string, int> type_of;      // PF -> its offered type
  for (const discovery::SelectedVgpuGpu& gpu : scan.selection.vgpu_gpus) {
    if (!counters || gpu.type_id == 0 || gpu.bound <= 0) continue;
    group_of[gpu.pf] = groups.size();
    type_of[gpu.pf] = gpu.type_id;
    groups.push_back(ParentGroup{VgpuGpuCounterSetName(gpu.pf), {}, gpu.bound});
  }
  for (const discovery::SelectedVgpuVf& selected : scan.selection.vgpu_vfs) {
    const PciFunction* vf = scan.inventory.Find(selected.address);
    if (vf == nullptr || !vf->sriov_vf) continue;
    const auto group = group_of.find(vf->sriov_vf->pf);
    const int counted = group == group_of.end() ? 0 : type_of.at(vf->sriov_vf->pf);
    std::vector<SliceDevice> devices;
    if (selected.current_type != 0) {
      devices.push_back(VgpuDevice(*vf, selected.current_type, selected.current_name));
    } else if (counters) {
      for (const auto& type : selected.offered) {
        devices.push_back(VgpuDevice(*vf, type.id, type.name));
      }
    }
    for (SliceDevice& device : devices) {
      const int type =
          selected.current_type != 0 ? selected.current_type : selected.offered.front().id;
      if (counted == 0 || type != counted) {
        if (selected.current_type != 0) plain.push_back(std::move(device));
        continue;  // an offer needs its GPU's counter set
      }
      ParentGroup& parent = groups[group->second];
      device.consumes_counters.push_back({parent.counter_set, {{kCapacityCounter, 1}}});
      parent.devices.push_back(std::move(device));
    }
  }
}

// The consumption a kept or held device is published with: as it was allocated
// (kubernetes#140802: the scheduler subtracts an allocated device's consumption as the slices show
// it now, so a republish that dropped or changed it would offer what the device still uses). A
// kept device keeps what it was published with; a held device the builder now makes without the
// consumption it was published with (a VF running the vGPU it was allocated for) takes that back
// when the builder makes none of those counter sets any more (where it still makes one, its
// capacity already counts what exists). Empty when the device consumes nothing.
std::vector<CounterConsumption> AllocatedConsumption(const SliceDevice& device, bool kept,
                                                     const TaintInputs& inputs,
                                                     const std::set<std::string>& built_sets) {
  if (kept || !device.consumes_counters.empty()) return device.consumes_counters;
  if (inputs.held.count(device.name) == 0 || inputs.published == nullptr) return {};
  const std::optional<SliceDevice> before = inputs.published->Find(device.name);
  if (!before) return {};
  for (const CounterConsumption& used : before->consumes_counters) {
    if (built_sets.count(used.counter_set) != 0) return {};
  }
  return before->consumes_counters;
}

// Moves the devices of `plain` that keep a consumption (AllocatedConsumption) to the group of
// their counter set: the set as built, or, when the builder no longer makes it, as last published
// (then nothing but kept devices uses it: it stays exactly while they do). A device whose sets are
// not all published any more, or a layout without counters, leaves it without counters.
void KeepAllocatedConsumption(std::vector<SliceDevice>& plain, const std::set<std::string>& kept,
                              const TaintInputs& inputs, CounterLayout layout,
                              std::vector<ParentGroup>& groups) {
  std::map<std::string, size_t> group_of;
  for (size_t i = 0; i < groups.size(); ++i) group_of[groups[i].counter_set] = i;
  std::set<std::string> built_sets;
  for (const auto& [name, index] : group_of) built_sets.insert(name);
  std::vector<SliceDevice> stays;
  for (SliceDevice& device : plain) {
    std::vector<CounterConsumption> used =
        layout == CounterLayout::kNone
            ? std::vector<CounterConsumption>{}
            : AllocatedConsumption(device, kept.count(device.name) != 0, inputs, built_sets);
    const auto published = [&](const CounterConsumption& c) {
      return group_of.count(c.counter_set) != 0 ||
             (inputs.published_sets != nullptr && inputs.published_sets->count(c.counter_set));
    };
    if (used.empty() || !std::all_of(used.begin(), used.end(), published)) {
      device.consumes_counters.clear();
      stays.push_back(std::move(device));
      continue;
    }
    for (const CounterConsumption& c : used) {
      if (group_of.count(c.counter_set) != 0) continue;
      const CounterSet& set = inputs.published_sets->at(c.counter_set);
      auto capacity = set.counters.find(kCapacityCounter);
      groups.push_back({set.name, {}, capacity == set.counters.end() ? 0 : capacity->second});
      group_of[set.name] = groups.size() - 1;
    }
    device.consumes_counters = std::move(used);
    // First in its group: a group cut to the per-slice limit loses potential devices, never this.
    std::vector<SliceDevice>& members =
        groups[group_of.at(device.consumes_counters.front().counter_set)].devices;
    members.insert(members.begin(), std::move(device));
  }
  plain = std::move(stays);
}

// Counter sets in slices of their own (1.35+): devices that consume counters and plain devices
// follow in slices of their own limits.
void LayOutOwnSlice(std::vector<ParentGroup>& groups, std::vector<SliceDevice> plain,
                    size_t plain_limit, DesiredPool& pool) {
  std::vector<CounterSet> sets;
  std::vector<SliceDevice> consuming;
  for (auto& group : groups) {
    sets.push_back({group.counter_set, {{kCapacityCounter, group.capacity}}});
    for (auto& device : group.devices) {
      (device.consumes_counters.empty() ? plain : consuming).push_back(std::move(device));
    }
  }
  for (size_t i = 0; i < sets.size(); i += kMaxCounterSetsPerSlice) {
    SliceContent slice;
    slice.shared_counters.assign(sets.begin() + static_cast<std::ptrdiff_t>(i),
                                 sets.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                    sets.size(), i + kMaxCounterSetsPerSlice)));
    pool.slices.push_back(std::move(slice));
  }
  Chunk(std::move(plain), plain_limit, pool.slices);
  Chunk(std::move(consuming), kMaxDevicesPerSliceWithCounters, pool.slices);
}

// Before 1.35 a counter set and the devices using it must share one slice.
void LayOutInDeviceSlice(std::vector<ParentGroup>& groups, std::vector<SliceDevice> plain,
                         DesiredPool& pool) {
  // A parent's counter set and every device using it share one slice; small parents are
  // packed together while the per-slice limits allow.
  SliceContent current;
  size_t consumed = 0;
  auto flush = [&] {
    if (!current.devices.empty() || !current.shared_counters.empty()) {
      pool.slices.push_back(std::move(current));
    }
    current = SliceContent{};
    consumed = 0;
  };
  for (auto& group : groups) {
    if (group.devices.size() > kMaxDevicesPerSlice) {
      pool.warnings.push_back("counter set " + group.counter_set + ": " +
                              std::to_string(group.devices.size() - kMaxDevicesPerSlice) +
                              " potential mdev instances left out (at most " +
                              std::to_string(kMaxDevicesPerSlice) +
                              " devices share a slice with their counters before 1.35)");
      group.devices.resize(kMaxDevicesPerSlice);
    }
    if (current.devices.size() + group.devices.size() > kMaxDevicesPerSlice ||
        current.shared_counters.size() + 1 > kMaxSharedCountersPerSlice ||
        consumed + group.devices.size() > 1024) {
      flush();
    }
    current.shared_counters.push_back({group.counter_set, {{kCapacityCounter, group.capacity}}});
    for (auto& device : group.devices) {
      consumed += device.consumes_counters.size();
      current.devices.push_back(std::move(device));
    }
  }
  flush();
  Chunk(std::move(plain), kMaxDevicesPerSlice, pool.slices);
}

}  // namespace

discovery::NodeScan BuilderInput(const discovery::NodeScan& scan) {
  discovery::NodeScan kept;
  const discovery::Inventory& inventory = scan.inventory;
  auto keep = [&](const std::string& address) {
    if (const PciFunction* fn = inventory.Find(address)) {
      kept.inventory.functions.emplace(address, *fn);
    }
  };
  for (const auto& selected : scan.selection.devices) {
    keep(selected.address);
    for (const std::string& companion : selected.companions) keep(companion);
  }
  for (const auto& selected : scan.selection.vgpu_vfs) keep(selected.address);
  for (const MdevParent& parent : inventory.mdev_parents) {
    if (!parent.pci_address.empty()) keep(parent.pci_address);
  }
  // Taints read the PFs of VFs (their links) and the group-unsafe decisions (device_taints.h).
  std::vector<std::string> pfs;
  for (const auto& [address, fn] : kept.inventory.functions) {
    if (fn.sriov_vf) pfs.push_back(fn.sriov_vf->pf);
  }
  for (const std::string& pf : pfs) keep(pf);
  for (const auto& [address, decision] : scan.selection.functions) {
    if (!decision.group_unsafe) continue;
    keep(address);
    kept.selection.functions.emplace(address, decision);
  }
  kept.inventory.mdev_parents = inventory.mdev_parents;
  kept.inventory.iommu_enabled = inventory.iommu_enabled;
  kept.inventory.listed = inventory.listed;
  kept.selection.devices = scan.selection.devices;
  kept.selection.mdev_types = scan.selection.mdev_types;
  kept.selection.vgpu_vfs = scan.selection.vgpu_vfs;
  kept.selection.vgpu_gpus = scan.selection.vgpu_gpus;
  return kept;
}

DesiredPool BuildDesiredPool(const discovery::NodeScan& scan, const BuildOptions& options,
                             const MdevTypeMaxima& maxima) {
  const discovery::Inventory& inventory = scan.inventory;
  DesiredPool pool;
  pool.name = options.node_name;

  std::map<std::string, SliceDevice> whole_devices;  // by address
  for (const auto& selected : scan.selection.devices) {
    const PciFunction* fn = inventory.Find(selected.address);
    if (fn == nullptr) continue;
    SliceDevice device = PciDevice(selected, *fn);
    if (fn->bound_by_vfio_dra) KeepPublishedNetdev(device, options.published);
    whole_devices[selected.address] = std::move(device);
  }

  std::set<std::pair<std::string, std::string>> published_types;
  for (const auto& t : scan.selection.mdev_types) published_types.insert({t.parent, t.type_id});

  std::vector<ParentGroup> groups;
  for (const MdevParent& parent : inventory.mdev_parents) {
    bool any_published = false;
    for (const auto& type : parent.types) {
      if (published_types.count({parent.name, type.id})) any_published = true;
    }
    if (!any_published) continue;
    const PciFunction* parent_fn =
        parent.pci_address.empty() ? nullptr : inventory.Find(parent.pci_address);
    std::optional<SliceDevice> whole;
    if (parent_fn != nullptr) {
      if (auto it = whole_devices.find(parent_fn->address); it != whole_devices.end()) {
        whole = std::move(it->second);
        whole_devices.erase(it);
      }
    }
    groups.push_back(BuildParentGroup(parent, parent_fn, std::move(whole), published_types, options,
                                      maxima, pool.warnings));
  }

  // Whole devices that are not partitionable, in address order.
  std::vector<SliceDevice> plain;
  plain.reserve(whole_devices.size());
  for (auto& [address, device] : whole_devices) plain.push_back(std::move(device));
  AddVgpuVfs(scan, options, groups, plain);
  if (options.taints != nullptr) {
    std::set<std::string> built;
    auto taint = [&](SliceDevice& device) {
      built.insert(device.name);
      TaintDevice(device, scan, *options.taints, pool.taint_reasons);
    };
    for (SliceDevice& device : plain) taint(device);
    for (ParentGroup& group : groups) {
      for (SliceDevice& device : group.devices) taint(device);
    }
    std::set<std::string> kept;
    for (SliceDevice& device : KeptDevices(scan, *options.taints, built, pool.taint_reasons)) {
      kept.insert(device.name);
      plain.push_back(std::move(device));
    }
    KeepAllocatedConsumption(plain, kept, *options.taints, options.layout, groups);
    pool.kept = std::move(kept);
  }

  switch (options.layout) {
    case CounterLayout::kNone: {
      for (auto& group : groups) {
        for (auto& device : group.devices) plain.push_back(std::move(device));
      }
      const size_t limit = PlainLimit(plain, options);
      Chunk(std::move(plain), limit, pool.slices);
      break;
    }
    case CounterLayout::kOwnSlice: {
      const size_t limit = PlainLimit(plain, options);
      LayOutOwnSlice(groups, std::move(plain), limit, pool);
      break;
    }
    case CounterLayout::kInDeviceSlice:
      LayOutInDeviceSlice(groups, std::move(plain), pool);
      break;
  }
  // Every pool has at least one slice, even an empty one, so consumers see the pool exists.
  if (pool.slices.empty()) pool.slices.emplace_back();
  return pool;
}

}  // namespace vfio_dra::slicepublisher
