#include "discovery/vgpu_selection.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

namespace vfio_dra::discovery {
namespace {

using sysfs::CreatableVgpuType;

std::string TypeText(int id, const std::string& name) {
  return name.empty() ? std::to_string(id) : fmt::format("{} ({})", id, name);
}

std::string TypeList(const std::map<int, std::string>& types) {
  std::string text;
  for (const auto& [id, name] : types) text += (text.empty() ? "" : ", ") + TypeText(id, name);
  return text;
}

// The deny entry that keeps vGPU type `type` off the VF `vf` (nullptr: none). Entries without a
// type deny by the VF's fields; entries of another kind do not apply.
const DeviceSelector* DenyingEntry(const AdminPolicy& policy, const CreatableVgpuType& type,
                                   const PciFunction& vf) {
  for (const DeviceSelector& s : policy.deny) {
    if (s.kind.has_value() && *s.kind != DeviceKind::kVgpu) continue;
    if (s.vgpu_types.empty() ? s.MatchesFunction(vf) : s.MatchesVgpu(type, vf)) return &s;
  }
  return nullptr;
}

// Why the NVIDIA vGPU VF `fn` cannot be published at all (empty: it can).
std::string VgpuVfBlocker(const Inventory& inventory, const AdminPolicy& policy,
                          const PciFunction& fn) {
  if (!policy.KindEnabled(DeviceKind::kVgpu)) {
    return "kind vgpu is turned off by the policy (" + policy.source + ")";
  }
  for (const DeviceSelector& s : policy.deny) {
    if (s.kind.has_value() && *s.kind != DeviceKind::kVgpu) continue;
    if (s.vgpu_types.empty() && s.MatchesFunction(fn)) {
      return "denied by the policy (" + s.where + ")";
    }
  }
  const PciFunction* pf = fn.sriov_vf ? inventory.Find(fn.sriov_vf->pf) : nullptr;
  if (pf == nullptr || pf->vendor_id != 0x10de || pf->driver != "nvidia" || fn.driver != "nvidia") {
    return "has nvidia/current_vgpu_type but is not a VF on nvidia of an NVIDIA PF on nvidia; "
           "not a vGPU VF vfio-dra knows";
  }
  if (!fn.iommu_group.has_value()) return "no IOMMU group: its vGPU could not be handed out";
  const IommuGroup& group = inventory.iommu_groups.at(*fn.iommu_group);
  for (const std::string& member : group.members) {
    const PciFunction* other = inventory.Find(member);
    if (member != fn.address && other != nullptr && !other->IsBridge()) {
      return fmt::format("IOMMU group {} also holds {}: a vGPU VF is handed out alone",
                         *fn.iommu_group, member);
    }
  }
  if (!group.unreadable_members.empty()) {
    return fmt::format("IOMMU group {} also holds {}, whose sysfs entry could not be read",
                       *fn.iommu_group, group.unreadable_members.front());
  }
  return "";
}

std::string ModelOf(const PciFunction& pf) {
  return fmt::format("{:04x}:{:04x}", pf.vendor_id, pf.device_id);
}

// What the driver shows of one GPU now.
struct GpuView {
  const PciFunction* pf = nullptr;
  std::vector<const PciFunction*> vfs;  // the publishable vGPU VFs, by address
  int vf_count = 0;                     // every vGPU VF of the GPU
  std::map<int, int> running;           // type -> vGPUs of it on the GPU
  std::map<int, std::string> listed;    // what its publishable VFs can take now
};

bool DeniedEverywhere(const AdminPolicy& policy, const GpuView& gpu, const CreatableVgpuType& t) {
  return std::all_of(gpu.vfs.begin(), gpu.vfs.end(), [&](const PciFunction* vf) {
    return DenyingEntry(policy, t, *vf) != nullptr;
  });
}

// The one type the GPU's free VFs offer, or why none.
struct TypeChoice {
  int id = 0;
  std::string name;
  const VgpuLayout* layout = nullptr;  // an onDemand layout that chose it
  std::string state;                   // when none: why, and the fix
};

std::string FixText(const std::string& pf, const std::string& type) {
  return fmt::format(
      "declare the GPU's layout (vgpuLayouts: [{{match: {{address: \"{0}\"}}, vgpuType: \"{1}\", "
      "count: max}}]) or pin one type for it (select: [{{kind: vgpu, pf: \"{0}\", vgpuType: "
      "\"{1}\"}}])",
      pf, type);
}

TypeChoice ChooseFromLayout(const GpuView& gpu, const VgpuLayout& layout,
                            const std::map<int, std::string>& names) {
  TypeChoice choice;
  const std::string count = layout.count ? std::to_string(*layout.count) : "as many as fit";
  for (const auto& [id, n] : gpu.running) {
    if (!layout.MatchesType({id, names.count(id) ? names.at(id) : ""})) {
      choice.state = fmt::format(
          "{} declares {} x {}, but the GPU runs {}: the layout cannot apply until those vGPUs "
          "are removed; the existing ones are published as they are, nothing new is offered",
          layout.where, count, layout.vgpu_type, TypeText(id, names.count(id) ? names.at(id) : ""));
      return choice;
    }
  }
  if (layout.create == VgpuCreation::kAhead) {
    choice.state = fmt::format(
        "{} declares {} x {} created ahead: only the vGPUs that exist are published, each once; "
        "free VFs offer nothing",
        layout.where, count, layout.vgpu_type);
    return choice;
  }
  std::map<int, std::string> known = gpu.listed;
  for (const auto& [id, n] : gpu.running) known.emplace(id, names.count(id) ? names.at(id) : "");
  for (const auto& [id, name] : known) {
    if (!layout.MatchesType({id, name})) continue;
    choice.id = id;
    choice.name = name;
    choice.layout = &layout;
    return choice;
  }
  choice.state = fmt::format(
      "{} declares type {} created on demand, but no VF of the GPU lists it (they list: {}); "
      "nothing new is offered",
      layout.where, layout.vgpu_type, known.empty() ? "nothing" : TypeList(known));
  return choice;
}

TypeChoice ChooseType(const AdminPolicy& policy, const GpuView& gpu,
                      const std::map<int, std::string>& names) {
  if (const VgpuLayout* layout = policy.VgpuLayoutFor(*gpu.pf)) {
    return ChooseFromLayout(gpu, *layout, names);
  }
  const bool pinned = policy.HasSelectorsFor(DeviceKind::kVgpu);
  auto selected = [&](const CreatableVgpuType& type) {
    if (!pinned) return true;
    return std::any_of(gpu.vfs.begin(), gpu.vfs.end(), [&](const PciFunction* vf) {
      return std::any_of(policy.select.begin(), policy.select.end(), [&](const DeviceSelector& s) {
        return s.kind == DeviceKind::kVgpu && s.MatchesVgpu(type, *vf);
      });
    });
  };
  TypeChoice choice;
  if (gpu.running.size() > 1) {
    std::map<int, std::string> running;
    for (const auto& [id, n] : gpu.running) running[id] = names.count(id) ? names.at(id) : "";
    choice.state = "runs several types (" + TypeList(running) + "): nothing new is offered";
    return choice;
  }
  if (gpu.running.size() == 1) {
    const int id = gpu.running.begin()->first;
    const std::string name = names.count(id) ? names.at(id) : "";
    if (!selected({id, name})) {
      choice.state = fmt::format(
          "runs {}, which no vgpu selector of the policy matches: nothing new is offered",
          TypeText(id, name));
      return choice;
    }
    choice.id = id;
    choice.name = name;
    return choice;
  }
  std::map<int, std::string> candidates;
  for (const auto& [id, name] : gpu.listed) {
    if (selected({id, name}) && !DeniedEverywhere(policy, gpu, {id, name})) candidates[id] = name;
  }
  if (candidates.size() == 1) {
    choice.id = candidates.begin()->first;
    choice.name = candidates.begin()->second;
    return choice;
  }
  const std::string example =
      candidates.empty() ? "<type>" : std::to_string(candidates.rbegin()->first);
  if (candidates.empty()) {
    choice.state = pinned ? "no vgpu selector of the policy matches a type its VFs list (" +
                                TypeList(gpu.listed) + "): nothing new is offered"
                          : "its VFs list no type it may offer: nothing new is offered";
  } else {
    choice.state = fmt::format(
        "idle, with several types ({}) and none chosen: nothing new is offered, since the "
        "scheduler could allocate types or counts the GPU cannot hold together; {}",
        TypeList(candidates), FixText(gpu.pf->address, example));
  }
  return choice;
}

// How many vGPUs of `choice` the GPU holds, and where that comes from (0: unknown, and why).
struct Bound {
  int n = 0;
  std::string source;
};

Bound BoundOf(const GpuView& gpu, const TypeChoice& choice, const VgpuGpuSizes& sizes) {
  if (choice.layout != nullptr && choice.layout->count) {
    return {*choice.layout->count, choice.layout->where + ".count"};
  }
  const std::optional<int> size = VgpuFrameBufferGb(choice.name);
  if (!size || *size <= 0) {
    return {0, "its name \"" + choice.name +
                   "\" does not give its frame buffer (a MIG-backed type, or an unknown form)"};
  }
  const auto known = sizes.find(gpu.pf->address);
  if (known == sizes.end() || known->second.model != ModelOf(*gpu.pf)) {
    return {0,
            "the GPU's largest type, its whole frame buffer, is listed only while the GPU is "
            "idle, and vfio-dra has not seen it idle"};
  }
  const VgpuGpuSize& whole = known->second;
  const int n = std::min(whole.largest_gb / *size, gpu.vf_count);
  if (n < 1) return {0, "its frame buffer is larger than the GPU's"};
  return {n, fmt::format("frame buffer: {} GB of the GPU's {} GB ({}){}", *size, whole.largest_gb,
                         whole.largest_name, n == gpu.vf_count ? ", capped at its VF count" : "")};
}

// The vGPUs that exist on the GPU are published as they are, unless their type is denied.
void PublishExisting(const AdminPolicy& policy, const GpuView& gpu,
                     const std::map<int, std::string>& names, DeviceSelection& selection) {
  for (const PciFunction* vf : gpu.vfs) {
    const int current = vf->vgpu_vf->current_type;
    if (current == 0) continue;
    const std::string name = names.count(current) ? names.at(current) : "";
    FunctionDecision& decision = selection.functions[vf->address];
    const std::string held =
        "vGPU VF of " + gpu.pf->address + ": holds vGPU " + TypeText(current, name);
    if (const DeviceSelector* denied = DenyingEntry(policy, {current, name}, *vf)) {
      decision.reason = held + ", not published: denied by the policy (" + denied->where + ")";
      continue;
    }
    decision.published = true;
    decision.reason = held + ", published as it is; never offered another type";
    selection.vgpu_vfs.push_back(SelectedVgpuVf{vf->address, current, name, {}});
  }
}

// The free VFs: T on as many as the bound leaves room for, in address order.
void OfferOnFreeVfs(const AdminPolicy& policy, const GpuView& gpu, const SelectedVgpuGpu& chosen,
                    DeviceSelection& selection) {
  const CreatableVgpuType type{chosen.type_id, chosen.type_name};
  const auto existing = gpu.running.find(chosen.type_id);
  int room = chosen.bound - (existing == gpu.running.end() ? 0 : existing->second);
  const std::string prefix = "vGPU VF of " + gpu.pf->address + ": holds no vGPU; ";
  for (const PciFunction* vf : gpu.vfs) {
    if (vf->vgpu_vf->current_type != 0) continue;
    FunctionDecision& decision = selection.functions[vf->address];
    if (chosen.type_id == 0) {
      decision.reason = prefix + "nothing offered: " + chosen.state;
      continue;
    }
    const auto& creatable = vf->vgpu_vf->creatable;
    const bool listed = std::any_of(creatable.begin(), creatable.end(),
                                    [&](const auto& t) { return t.id == type.id; });
    const DeviceSelector* denied = DenyingEntry(policy, type, *vf);
    if (denied != nullptr) {
      decision.reason = prefix + TypeText(type.id, type.name) + " is denied by the policy (" +
                        denied->where + ")";
    } else if (!listed) {
      decision.reason = prefix + "can take " + TypeText(type.id, type.name) +
                        " no more now (creatable_vgpu_types does not list it)";
    } else if (room <= 0) {
      decision.reason = prefix + fmt::format(
                                     "not offered: the GPU's {} vGPUs of {} exist or are offered "
                                     "on other VFs",
                                     chosen.bound, TypeText(type.id, type.name));
    } else {
      --room;
      decision.published = true;
      decision.reason = prefix + "offered " + TypeText(type.id, type.name) + "; " + chosen.state;
      selection.vgpu_vfs.push_back(SelectedVgpuVf{vf->address, 0, "", {type}});
    }
  }
}

void SelectGpu(const AdminPolicy& policy, const GpuView& gpu,
               const std::map<int, std::string>& names, const VgpuGpuSizes& sizes,
               DeviceSelection& selection) {
  PublishExisting(policy, gpu, names, selection);
  SelectedVgpuGpu chosen;
  chosen.pf = gpu.pf->address;
  const TypeChoice choice = ChooseType(policy, gpu, names);
  if (choice.id == 0) {
    chosen.state = choice.state;
  } else if (const DeviceSelector* denied =
                 DeniedEverywhere(policy, gpu, {choice.id, choice.name})
                     ? DenyingEntry(policy, {choice.id, choice.name}, *gpu.vfs.front())
                     : nullptr) {
    chosen.state = fmt::format(
        "would offer {}, which the policy denies ({}): nothing new is "
        "offered",
        TypeText(choice.id, choice.name), denied->where);
  } else if (const Bound bound = BoundOf(gpu, choice, sizes); bound.n == 0) {
    chosen.state = fmt::format(
        "would offer {} created at prepare, but nothing bounds how many the GPU holds ({}): "
        "nothing new is offered; declare the count (vgpuLayouts: [{{match: {{address: \"{}\"}}, "
        "vgpuType: \"{}\", count: N, create: onDemand}}])",
        TypeText(choice.id, choice.name), bound.source, gpu.pf->address, choice.id);
  } else {
    chosen.type_id = choice.id;
    chosen.type_name = choice.name;
    chosen.bound = bound.n;
    chosen.bound_source = bound.source;
    chosen.state = fmt::format("the GPU offers {} created at prepare, at most {} on it ({})",
                               TypeText(choice.id, choice.name), bound.n, bound.source);
  }
  OfferOnFreeVfs(policy, gpu, chosen, selection);
  selection.vgpu_gpus.push_back(std::move(chosen));
}

}  // namespace

VgpuGpuSizes ObserveVgpuGpuSizes(const Inventory& inventory, VgpuGpuSizes known) {
  std::map<std::string, bool> idle;  // PF -> no VF holds a vGPU
  std::map<std::string, VgpuGpuSize> seen;
  for (const auto& [address, fn] : inventory.functions) {
    if (!fn.vgpu_vf || !fn.sriov_vf) continue;
    const std::string& pf = fn.sriov_vf->pf;
    idle.emplace(pf, true);
    if (fn.vgpu_vf->current_type != 0) idle[pf] = false;
    for (const auto& type : fn.vgpu_vf->creatable) {
      const std::optional<int> gb = VgpuFrameBufferGb(type.name);
      if (gb && *gb > seen[pf].largest_gb) {
        seen[pf].largest_gb = *gb;
        seen[pf].largest_name = type.name;
      }
      seen[pf].types[type.id] = type.name;
    }
  }
  for (auto& [pf, size] : seen) {
    const PciFunction* pf_fn = inventory.Find(pf);
    if (!idle[pf] || pf_fn == nullptr || size.largest_gb == 0) continue;
    size.model = ModelOf(*pf_fn);
    known[pf] = size;
  }
  return known;
}

std::optional<int> VgpuFrameBufferGb(const std::string& type_name) {
  std::string body = type_name;
  if (body.rfind("NVIDIA ", 0) == 0) body = body.substr(7);
  const size_t dash = body.find('-');
  if (dash == std::string::npos || dash == 0 || body.find('-', dash + 1) != std::string::npos) {
    return std::nullopt;
  }
  const std::string size = body.substr(dash + 1);
  size_t digits = 0;
  while (digits < size.size() && size[digits] >= '0' && size[digits] <= '9') ++digits;
  if (digits == 0 || digits > 4 || digits + 1 != size.size() || size[digits] < 'A' ||
      size[digits] > 'Z') {
    return std::nullopt;
  }
  return std::stoi(size.substr(0, digits));
}

void SelectVgpus(const Inventory& inventory, const AdminPolicy& policy, const VgpuGpuSizes& sizes,
                 DeviceSelection& selection) {
  // Names of the types by ID, from every VF's list: a VF that holds a vGPU lists nothing.
  std::map<int, std::string> names;
  std::map<std::string, GpuView> gpus;
  for (const auto& [address, fn] : inventory.functions) {
    if (!fn.vgpu_vf) continue;
    for (const auto& type : fn.vgpu_vf->creatable) names[type.id] = type.name;
    FunctionDecision& decision = selection.functions[address];
    decision.kind = DeviceKind::kVgpu;
    const std::string pf = fn.sriov_vf ? fn.sriov_vf->pf : "";
    if (std::string blocker = VgpuVfBlocker(inventory, policy, fn); !blocker.empty()) {
      decision.reason = "vGPU VF of " + pf + ": " + blocker;
      if (const PciFunction* pf_fn = inventory.Find(pf); pf_fn != nullptr) {
        GpuView& gpu = gpus[pf];
        gpu.pf = pf_fn;
        ++gpu.vf_count;
        if (fn.vgpu_vf->current_type != 0) ++gpu.running[fn.vgpu_vf->current_type];
      }
      continue;
    }
    GpuView& gpu = gpus[pf];
    gpu.pf = inventory.Find(pf);
    gpu.vfs.push_back(&fn);
    ++gpu.vf_count;
    if (fn.vgpu_vf->current_type != 0) ++gpu.running[fn.vgpu_vf->current_type];
    for (const auto& type : fn.vgpu_vf->creatable) gpu.listed[type.id] = type.name;
  }
  // A full GPU lists no type, not even the one it runs: its name is what the GPU listed idle.
  for (const auto& [pf, size] : sizes) {
    for (const auto& [id, name] : size.types) names.emplace(id, name);
  }
  for (const auto& [pf, gpu] : gpus) {
    if (gpu.vfs.empty()) continue;  // every VF blocked: its decision says why
    SelectGpu(policy, gpu, names, sizes, selection);
  }
  std::sort(selection.vgpu_vfs.begin(), selection.vgpu_vfs.end(),
            [](const SelectedVgpuVf& a, const SelectedVgpuVf& b) { return a.address < b.address; });
}

}  // namespace vfio_dra::discovery
