// See vgpu_layout_applier.h.
#include "prepare/vgpu_layout_applier.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "prepare/device_lock_keys.h"

namespace vfio_dra::prepare {
namespace {

constexpr uint32_t kNvidiaVendor = 0x10de;

// The layout's type as an ID: its own digits, or the ID a VF lists under its name.
std::optional<int> ResolveType(const discovery::VgpuLayout& layout,
                               const std::vector<std::string>& vfs,
                               const discovery::Inventory& inventory) {
  const std::string& type = layout.vgpu_type;
  if (!type.empty() && type.size() <= 9 &&
      std::all_of(type.begin(), type.end(), [](char c) { return std::isdigit(c) != 0; })) {
    return std::stoi(type);
  }
  for (const std::string& vf : vfs) {
    for (const sysfs::CreatableVgpuType& listed : inventory.Find(vf)->vgpu_vf->creatable) {
      if (layout.MatchesType(listed)) return listed.id;
    }
  }
  return std::nullopt;
}

bool Lists(const discovery::PciFunction& vf, int type_id) {
  return std::any_of(vf.vgpu_vf->creatable.begin(), vf.vgpu_vf->creatable.end(),
                     [&](const sysfs::CreatableVgpuType& t) { return t.id == type_id; });
}

// The name the VF lists for `type_id` ("" when it lists none now).
std::string TypeName(const discovery::PciFunction& vf, int type_id) {
  for (const sysfs::CreatableVgpuType& listed : vf.vgpu_vf->creatable) {
    if (listed.id == type_id) return listed.name;
  }
  return "";
}

std::string OtherTypes(const std::map<int, int>& others) {
  std::string text;
  for (const auto& [type, vfs] : others) {
    text += (text.empty() ? "" : ", ") + std::to_string(type) + " (on " + std::to_string(vfs) +
            (vfs == 1 ? " VF)" : " VFs)");
  }
  return text;
}

}  // namespace

Result<std::unique_ptr<VgpuLayoutApplier>> VgpuLayoutApplier::Open(
    VgpuLayoutOptions options, const discovery::AdminPolicy& policy,
    const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer,
    const PrepareCheckpoint& checkpoint, Logger log) {
  auto locks = PrepareLocks::Open(options.plugin_data_dir);
  if (!locks.ok()) return locks.error().Wrap("cannot apply the declared vGPU layouts");
  return std::unique_ptr<VgpuLayoutApplier>(new VgpuLayoutApplier(
      std::move(options), policy, sysfs, writer, checkpoint, std::move(*locks), std::move(log)));
}

VgpuLayoutApplier::VgpuLayoutApplier(VgpuLayoutOptions options,
                                     const discovery::AdminPolicy& policy,
                                     const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer,
                                     const PrepareCheckpoint& checkpoint, PrepareLocks locks,
                                     Logger log)
    : options_(std::move(options)),
      policy_(policy),
      sysfs_(sysfs),
      checkpoint_(checkpoint),
      locks_(std::move(locks)),
      gate_(writer),
      vgpus_(sysfs_, gate_, options_.write_timeout),
      log_(std::move(log)) {}

bool VgpuLayoutApplier::HasWork() const {
  return policy_.vgpu_enabled &&
         std::any_of(policy_.vgpu_layouts.begin(), policy_.vgpu_layouts.end(),
                     [](const discovery::VgpuLayout& layout) {
                       return layout.create == discovery::VgpuCreation::kAhead;
                     });
}

VgpuLayoutPass VgpuLayoutApplier::Apply(const discovery::Inventory& inventory) {
  std::lock_guard<std::mutex> lock(mu_);
  VgpuLayoutPass pass;
  if (!HasWork()) return pass;
  for (Gpu& gpu : GpusWithLayouts(inventory)) {
    if (Unmet(gpu, inventory)) Fill(gpu, inventory, pass);
  }
  return pass;
}

std::vector<VgpuLayoutApplier::Gpu> VgpuLayoutApplier::GpusWithLayouts(
    const discovery::Inventory& inventory) const {
  std::vector<Gpu> gpus;
  for (const auto& [address, fn] : inventory.functions) {
    if (!fn.sriov_pf || fn.vendor_id != kNvidiaVendor || fn.driver != "nvidia") continue;
    const discovery::VgpuLayout* layout = policy_.VgpuLayoutFor(fn);
    if (layout == nullptr || layout->create != discovery::VgpuCreation::kAhead) continue;
    Gpu gpu{address, {}, layout, 0};
    for (const std::string& vf : fn.sriov_pf->vfs) {
      const discovery::PciFunction* function = inventory.Find(vf);
      if (function != nullptr && function->vgpu_vf) gpu.vfs.push_back(vf);
    }
    if (gpu.vfs.empty()) continue;
    std::sort(gpu.vfs.begin(), gpu.vfs.end());
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

bool VgpuLayoutApplier::Unmet(Gpu& gpu, const discovery::Inventory& inventory) {
  const discovery::VgpuLayout& layout = *gpu.layout;
  const std::string prefix = layout.where + ": GPU " + gpu.pf;
  std::optional<int> type_id = ResolveType(layout, gpu.vfs, inventory);
  // A full GPU lists no type: a name resolved before still names the same ID.
  const std::string known_key = gpu.pf + " " + layout.vgpu_type;
  if (type_id) {
    type_ids_[known_key] = *type_id;
  } else if (auto it = type_ids_.find(known_key); it != type_ids_.end()) {
    type_id = it->second;
  }
  int existing = 0;
  bool listed = false;    // a free VF lists the type: the driver would take it now
  bool any_free = false;  // a VF holds no vGPU and is not denied
  std::map<int, int> others;
  for (const std::string& address : gpu.vfs) {
    const discovery::PciFunction& vf = *inventory.Find(address);
    const int current = vf.vgpu_vf->current_type;
    if (current == 0) {
      const bool usable = !type_id || !Denied(vf, *type_id);
      any_free = any_free || usable;
      listed = listed || (usable && type_id && Lists(vf, *type_id));
    } else if (type_id && current == *type_id) {
      ++existing;
    } else {
      ++others[current];
    }
  }
  if (!type_id && others.empty()) {
    NoteOnce(gpu.pf, prefix + ": no VF lists the layout's vGPU type \"" + layout.vgpu_type +
                         "\": check the name against nvidia/creatable_vgpu_types");
    return false;
  }
  const bool lists_any = std::any_of(gpu.vfs.begin(), gpu.vfs.end(), [&](const std::string& vf) {
    return !inventory.Find(vf)->vgpu_vf->creatable.empty();
  });
  if (!type_id && !lists_any) {
    // A full GPU lists nothing, so a type named by name cannot be told from another one.
    NoteOnce(gpu.pf,
             prefix + " runs vGPU type " + OtherTypes(others) +
                 " and no VF lists a type now (the GPU is full): nothing to create for \"" +
                 layout.vgpu_type + "\"",
             false);
    return false;
  }
  if (!others.empty()) {
    NoteOnce(gpu.pf, prefix + " runs vGPU type " + OtherTypes(others) + ", not the layout's \"" +
                         layout.vgpu_type +
                         "\" (as far as the driver's lists tell); vfio-dra never destroys a "
                         "vGPU, so the GPU is left as it is. To apply the layout, clear those "
                         "vGPUs once no VM uses them (echo 0 > <VF>/nvidia/current_vgpu_type)");
    return false;
  }
  gpu.type_id = *type_id;
  if (layout.count && existing >= *layout.count) {
    Forget(gpu.pf);
    return false;
  }
  if (listed) return true;
  NoteShort(gpu, existing, any_free);
  return false;
}

void VgpuLayoutApplier::NoteShort(const Gpu& gpu, int existing, bool gpu_full) {
  const std::string holds = gpu.layout->where + ": GPU " + gpu.pf + " holds " +
                            std::to_string(existing) + " of vGPU type " +
                            std::to_string(gpu.type_id);
  const std::optional<int> count = gpu.layout->count;
  if (!count) {
    NoteOnce(gpu.pf, holds + ", as many as the driver creates (count: max)", false);
  } else if (gpu_full) {
    NoteOnce(gpu.pf, holds +
                         " and the driver creates no more (ENODEV, or no free VF lists the type: "
                         "the GPU is full), fewer than the declared count " +
                         std::to_string(*count) + ": lower count to " + std::to_string(existing) +
                         " or use count: max");
  } else {
    NoteOnce(gpu.pf, holds + " and has no free VF left for the declared count " +
                         std::to_string(*count) +
                         ": enable more VFs, free the VFs that claims or other tools hold, or "
                         "lower count to " +
                         std::to_string(existing));
  }
}

void VgpuLayoutApplier::Fill(const Gpu& gpu, const discovery::Inventory& inventory,
                             VgpuLayoutPass& pass) {
  const auto busy_now = [&](const std::string& what) {
    pass.retry = true;
    log_.Debug(1, "declared vGPU layout: tried again at the next scan",
               {{"gpu", gpu.pf}, {"busy", what}});
  };
  // As a call holds them: an older version's instance takes the call lock exclusively, and
  // start-up recovery the decision lock.
  auto call = locks_.Call(Deadline::After(options_.lock_wait));
  if (!call.ok()) return busy_now(call.error().message);
  auto decision = locks_.Decision(Deadline::After(options_.lock_wait));
  if (!decision.ok()) return busy_now(decision.error().message);
  DeviceLockSet held(locks_);
  std::set<std::string> keys(gpu.vfs.begin(), gpu.vfs.end());
  keys.insert(gpu.pf);
  std::string busy;
  auto all = held.TryAdd(keys, busy);
  if (!all.ok()) return busy_now(all.error().message);
  if (!*all) return busy_now("device " + busy);
  // Every device of the GPU is locked: no record that names one can appear meanwhile.
  const CheckpointView view = checkpoint_.Load();
  if (view.listing_error || !view.unreadable.empty()) {
    pass.retry = true;
    NoteOnce(gpu.pf,
             gpu.layout->where + ": GPU " + gpu.pf +
                 ": not applied, the prepare checkpoint cannot be read in full, so which "
                 "VFs claims hold is unknown: " +
                 (view.listing_error ? *view.listing_error : view.unreadable.begin()->second));
    return;
  }
  std::set<std::string> claimed;
  for (const auto& [uid, record] : view.claims) AddDeviceKeys(*record, claimed);
  // The scan may be old: what the VFs hold now decides.
  int existing = 0;
  std::vector<std::string> free;
  for (const std::string& vf : gpu.vfs) {
    auto current = vgpus_.CurrentType(vf);
    if (!current.ok()) continue;  // gone since the scan: the next scan sees it
    if (*current == gpu.type_id) {
      ++existing;
    } else if (*current != 0) {
      return busy_now("VF " + vf + " took vGPU " + std::to_string(*current) + " since the scan");
    } else if (claimed.count(vf) == 0 && !Denied(*inventory.Find(vf), gpu.type_id)) {
      free.push_back(vf);
    }
  }
  Write(gpu, free, existing, pass);
}

void VgpuLayoutApplier::Write(const Gpu& gpu, const std::vector<std::string>& free, int& existing,
                              VgpuLayoutPass& pass) {
  const std::optional<int> count = gpu.layout->count;
  const std::string type = std::to_string(gpu.type_id);
  const std::string prefix = gpu.layout->where + ": GPU " + gpu.pf;
  bool full = false;
  bool skipped = false;  // a VF could not be written now
  bool vf_busy = false;
  for (const std::string& vf : free) {
    if (count && existing >= *count) break;
    if (options_.before_step) options_.before_step("vgpu-layout:" + vf);
    auto made = vgpus_.CreateOnFree(vf, gpu.type_id, Deadline::After(options_.write_timeout));
    if (!made.ok()) {
      skipped = true;
      NoteOnce(gpu.pf, prefix + ": " + made.error().message);
      continue;
    }
    if (*made == vfio::VgpuVfLifecycle::Creation::kGpuFull) {
      full = true;
      break;
    }
    if (*made == vfio::VgpuVfLifecycle::Creation::kVfBusy) {
      skipped = true;
      vf_busy = true;
      log_.Info("declared vGPU layout: VF is open (EBUSY), tried again at the next scan",
                {{"gpu", gpu.pf}, {"vf", vf}, {"vgpu_type", type}});
      continue;
    }
    ++existing;
    ++pass.created;
    log_.Info("declared vGPU layout: created a vGPU",
              {{"gpu", gpu.pf}, {"vf", vf}, {"vgpu_type", type}, {"layout", gpu.layout->where}});
  }
  if (count && existing >= *count) {
    Forget(gpu.pf);
    return;
  }
  // An open VF lets go in time; a failed write is tried again at the next full scan anyway.
  if (vf_busy && !full) pass.retry = true;
  if (full || !skipped) NoteShort(gpu, existing, full);
}

bool VgpuLayoutApplier::Denied(const discovery::PciFunction& vf, int type_id) const {
  for (const discovery::DeviceSelector& deny : policy_.deny) {
    if (deny.kind && *deny.kind != discovery::DeviceKind::kVgpu) continue;
    if (deny.vgpu_types.empty() ? deny.MatchesFunction(vf)
                                : deny.MatchesVgpu({type_id, TypeName(vf, type_id)}, vf)) {
      return true;
    }
  }
  return false;
}

void VgpuLayoutApplier::NoteOnce(const std::string& pf, const std::string& message, bool warning) {
  auto [it, inserted] = noted_.try_emplace(pf, message);
  if (!inserted && it->second == message) return;
  it->second = message;
  if (warning) {
    log_.Warn("declared vGPU layout not met", {{"problem", message}});
  } else {
    log_.Info("declared vGPU layout", {{"state", message}});
  }
}

}  // namespace vfio_dra::prepare
