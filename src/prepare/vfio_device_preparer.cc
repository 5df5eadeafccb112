#include "prepare/vfio_device_preparer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "base/k8s_names.h"
#include "base/text.h"
#include "slicepublisher/device_attributes.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {
namespace {

Error HeldByOther(const std::string& device, const std::string& what, const ClaimRecord& other) {
  return MakeError(
      ErrorKind::kFailedPrecondition,
      "device " + device + ": " + what + " is already prepared for " + other.Display() + " (" +
          (other.state == PrepareState::kPrepareCompleted ? "PrepareCompleted" : "PrepareStarted") +
          "); a device is never handed to two claims at once. Unprepare that claim "
          "first: the kubelet does so when its pod is gone (after a node reboot or "
          "a force-deleted pod, once it cleans the pod up)");
}

bool Contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// The PCI functions a call changes for a record or a plan: every function it binds and the parent
// of every mdev (see PrepareLocks).
void AddDeviceKeys(const ClaimRecord& record, std::set<std::string>& keys) {
  for (const FunctionRecord& f : record.functions) keys.insert(f.address);
  for (const MdevRecord& m : record.mdevs) keys.insert(m.parent);
  for (const VgpuRecord& v : record.vgpus) keys.insert(v.address);
  for (const RecordedDevice& device : record.devices) {
    keys.insert(device.functions.begin(), device.functions.end());
    if (device.is_mdev) keys.insert(device.mdev.parent);
    if (device.is_vgpu) keys.insert(device.address);
  }
}

void AddDeviceKeys(const std::vector<PlannedDevice>& plan, std::set<std::string>& keys) {
  for (const PlannedDevice& device : plan) {
    if (device.kind == PlannedKind::kPci) {
      keys.insert(device.functions.begin(), device.functions.end());
    } else if (device.kind == PlannedKind::kVgpu) {
      keys.insert(device.address);
    } else {
      keys.insert(device.mdev.parent);
    }
  }
}

// Whether prepare makes the vGPU of `device` (a type offered on an idle VF) or hands out the one
// its VF held when published. Both have the same name; only an offered type consumes its VF's
// counter set (see AddVgpuVfs in slice_builder.cc). Asked only before the VF is recorded: from
// then on the claim's record says, since once the type is set the VF is published as holding it.
bool MakesVgpu(const PlannedDevice& device) { return !device.published.consumes_counters.empty(); }

const VgpuRecord* FindVgpu(const ClaimRecord& record, const std::string& address) {
  for (const VgpuRecord& v : record.vgpus) {
    if (v.address == address) return &v;
  }
  return nullptr;
}

cdi::DeviceNode CdiNode(const vfio::CharDeviceNode& node) {
  return cdi::DeviceNode{node.path, "", node.major, node.minor};
}

}  // namespace

Result<std::unique_ptr<VfioDevicePreparer>> VfioDevicePreparer::Open(
    PreparerOptions options, const sysfs::SysfsReader& sysfs, sysfs::SysfsWriter& writer,
    const slicepublisher::PublishedDevices& published, Logger log) {
  auto boot_id = ReadBootId(options.boot_id_file);
  if (!boot_id.ok()) return boot_id.error();
  auto checkpoint = PrepareCheckpoint::Open(options.plugin_data_dir, *boot_id);
  if (!checkpoint.ok()) return checkpoint.error();
  if (const auto unwatched = checkpoint->unwatched()) {
    // Still correct, only slower: every prepare reads every record.
    log.Warn("prepare checkpoint not watched for changes", {{"problem", *unwatched}});
  }
  auto locks = PrepareLocks::Open(options.plugin_data_dir);
  if (!locks.ok()) return locks.error();
  return std::unique_ptr<VfioDevicePreparer>(
      new VfioDevicePreparer(std::move(options), sysfs, writer, published, std::move(*checkpoint),
                             std::move(*locks), std::move(log)));
}

VfioDevicePreparer::VfioDevicePreparer(PreparerOptions options, const sysfs::SysfsReader& sysfs,
                                       sysfs::SysfsWriter& writer,
                                       const slicepublisher::PublishedDevices& published,
                                       PrepareCheckpoint checkpoint, PrepareLocks locks, Logger log)
    : options_(std::move(options)),
      sysfs_(sysfs),
      published_(published),
      checkpoint_(std::move(checkpoint)),
      locks_(std::move(locks)),
      gate_(writer),
      binder_(sysfs, gate_, vfio::BinderOptions{options_.unbind_timeout, options_.dev_root}),
      mdevs_(sysfs, writer, gate_, options_.unbind_timeout),
      vgpus_(sysfs, gate_, options_.unbind_timeout),
      nodes_(sysfs, options_.dev_root),
      vf_network_(options_.vf_network, options_.pods, log.WithComponent("vf-network")),
      cdi_(options_.cdi_dir),
      metadata_(options_.plugin_data_dir, cdi::SpecDirectory(options_.cdi_dir),
                options_.driver_name),
      kind_(options_.driver_name + "/vfio"),
      log_(std::move(log)) {}

template <typename Op>
auto VfioDevicePreparer::Timed(const char* operation, Op op) -> decltype(op()) {
  const auto start = std::chrono::steady_clock::now();
  auto result = op();
  if (options_.metrics != nullptr) {
    options_.metrics->Observe(
        "vfio_dra_device_operation_duration_seconds", {{"operation", operation}},
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!result.ok()) {
      options_.metrics->Increment("vfio_dra_device_operation_errors_total",
                                  {{"operation", operation}});
    }
  }
  return result;
}

void VfioDevicePreparer::Note(const CheckpointView& view, uint64_t loaded_after) {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  std::map<std::string, std::shared_ptr<const ClaimRecord>> claims = view.claims;
  // A claim noted by a call after this view's Load began may be newer than what the view read:
  // the call's note stands until a view loaded after it.
  for (auto it = noted_at_.begin(); it != noted_at_.end();) {
    if (it->second <= loaded_after) {
      it = noted_at_.erase(it);
      continue;
    }
    if (auto own = noted_.claims.find(it->first); own != noted_.claims.end()) {
      claims[it->first] = own->second;
    } else {
      claims.erase(it->first);
    }
    ++it;
  }
  noted_.claims = std::move(claims);
  snapshots_stale_ = true;
}

uint64_t VfioDevicePreparer::NoteGeneration() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return note_generation_;
}

void VfioDevicePreparer::NoteClaim(const std::string& uid,
                                   std::shared_ptr<const ClaimRecord> record) {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  noted_at_[uid] = ++note_generation_;
  if (record) {
    noted_.claims[uid] = std::move(record);
  } else {
    noted_.claims.erase(uid);
  }
  snapshots_stale_ = true;
}

void VfioDevicePreparer::NoteClaimOnDisk(const std::string& uid) {
  auto record = checkpoint_.Find(uid);
  // Unreadable now: the next Refresh, or the next call of the claim, says what it is.
  if (!record.ok()) return;
  NoteClaim(uid, *record ? std::make_shared<const ClaimRecord>(std::move(**record)) : nullptr);
}

void VfioDevicePreparer::BuildSnapshotsLocked() const {
  if (!snapshots_stale_) return;
  CheckpointCounts counts;
  for (const auto& [uid, record] : noted_.claims) {
    (record->state == PrepareState::kPrepareCompleted ? counts.completed : counts.started) += 1;
  }
  counts_ = counts;
  prepared_ = std::make_shared<const std::vector<PreparedTarget>>(PreparedTargets(noted_));
  managed_ = std::make_shared<const std::map<std::string, discovery::ManagedFunction>>(
      prepare::ManagedFunctions(noted_));
  snapshots_stale_ = false;
}

CheckpointView VfioDevicePreparer::LoadView() {
  const uint64_t generation = NoteGeneration();
  CheckpointView view = checkpoint_.Load();
  for (const std::string& problem : view.problems) {
    log_.Error("prepare checkpoint problem", {{"problem", problem}});
  }
  Note(view, generation);
  return view;
}

void VfioDevicePreparer::Refresh() {
  const uint64_t generation = NoteGeneration();
  Note(checkpoint_.Load(), generation);
}

CheckpointCounts VfioDevicePreparer::Counts() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  BuildSnapshotsLocked();
  return counts_;
}

std::shared_ptr<const std::vector<PreparedTarget>> VfioDevicePreparer::Prepared() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  BuildSnapshotsLocked();
  return prepared_;
}

std::shared_ptr<const std::map<std::string, discovery::ManagedFunction>>
VfioDevicePreparer::ManagedFunctions() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  BuildSnapshotsLocked();
  return managed_;
}

void VfioDevicePreparer::Step(const std::string& name) const {
  if (options_.before_step) options_.before_step(name);
}

std::string VfioDevicePreparer::SpecFileName(const std::string& claim_uid) const {
  return cdi::TransientSpecFileName(kind_, claim_uid);
}

Result<PciIdentity> VfioDevicePreparer::ReadIdentity(const std::string& address) const {
  // One read of modalias, which carries all four IDs (and, unlike uevent, takes no device lock).
  const std::string path = "bus/pci/devices/" + address + "/modalias";
  auto text = sysfs_.Read(path);
  if (!text.ok()) return text.error().Wrap("cannot read the identity of PCI " + address);
  auto ids = sysfs::ParsePciModalias(*text);
  if (!ids.ok()) {
    return ids.error().Wrap("cannot read the identity of PCI " + address + ": " +
                            sysfs_.Path(path));
  }
  // As the vendor, device and subsystem files have them, without 0x: records compare equal
  // across versions.
  return PciIdentity{fmt::format("{:04x}", ids->vendor), fmt::format("{:04x}", ids->device),
                     fmt::format("{:04x}", ids->subsystem_vendor),
                     fmt::format("{:04x}", ids->subsystem_device)};
}

Status VfioDevicePreparer::RecordStart(const kube::ResourceClaim& claim,
                                       const std::vector<PlannedDevice>& plan, ClaimRecord& record,
                                       bool& changed, Deadline deadline) {
  record.uid = claim.uid;
  record.namespace_ = claim.namespace_;
  record.name = claim.name;
  std::set<std::string> recorded;
  for (const FunctionRecord& f : record.functions) recorded.insert(f.address);
  std::set<std::string> recorded_mdevs;
  for (const MdevRecord& m : record.mdevs) recorded_mdevs.insert(m.uuid);
  std::set<std::string> recorded_vgpus;
  for (const VgpuRecord& v : record.vgpus) recorded_vgpus.insert(v.address);
  for (const PlannedDevice& device : plan) {
    if (device.kind == PlannedKind::kVgpu) {
      if (!recorded_vgpus.insert(device.address).second) continue;
      auto identity = ReadIdentity(device.address);
      if (!identity.ok()) return identity.error();
      // CheckNewVgpus found the VF as the plan needs it. Only a vGPU this claim makes is removed
      // at unprepare; one handed out as it was stays.
      record.vgpus.push_back(
          {device.address, device.vgpu_type, MakesVgpu(device), std::move(*identity)});
      changed = true;
    } else if (device.kind == PlannedKind::kPci) {
      for (const std::string& address : device.functions) {
        if (!recorded.insert(address).second) continue;
        auto original = binder_.Inspect(address, VfioDriverOf(device, address), deadline);
        if (!original.ok()) return original.error();
        auto identity = ReadIdentity(address);
        if (!identity.ok()) return identity.error();
        record.functions.push_back(FunctionRecord::From(*original, std::move(*identity)));
        changed = true;
      }
    } else if (recorded_mdevs.insert(device.mdev.uuid).second) {
      record.mdevs.push_back({device.mdev.parent, device.mdev.type_id, device.mdev.uuid,
                              device.mdev_created_by_driver && !mdevs_.Exists(device.mdev.uuid)});
      changed = true;
    }
  }
  if (Status s = vf_network_.Record(plan, record, changed); !s.ok()) return s;
  std::vector<std::string> files{SpecFileName(claim.uid)};
  for (const PlannedDevice& device : plan) {
    const std::string request = kube::BaseRequestName(device.result.request);
    const std::string file = metadata_.CdiFileName(claim.uid, request);
    if (!Contains(files, file)) files.push_back(file);
  }
  for (const std::string& file : files) {
    if (!Contains(record.cdi_files, file)) {
      record.cdi_files.push_back(file);
      changed = true;
    }
  }
  if (record.state == PrepareState::kPrepareStarted) {
    std::vector<RecordedDevice> devices;
    devices.reserve(plan.size());
    for (const PlannedDevice& device : plan) devices.push_back(RecordOf(device));
    if (devices != record.devices || !record.replayable) {
      record.devices = std::move(devices);
      record.replayable = true;
      changed = true;
    }
  }
  return Status::Ok();
}

Status VfioDevicePreparer::CheckOverlap(const CheckpointView& view, const std::string& uid,
                                        const std::vector<PlannedDevice>& plan) const {
  // Every other record is checked on every prepare, and a record holds a function or two: plain
  // scans, not a set and two maps built per record.
  const auto holds_function = [](const ClaimRecord& other, const std::string& address) {
    return std::any_of(other.functions.begin(), other.functions.end(),
                       [&](const FunctionRecord& f) { return f.address == address; });
  };
  // A record that cannot be read may hold any device, these ones included: handing them out could
  // give one device to two claims.
  for (const auto& [other_uid, reason] : view.unreadable) {
    if (other_uid == uid || plan.empty()) continue;
    return MakeError(ErrorKind::kUnavailable,
                     "device " + plan.front().result.device +
                         " is not prepared: the checkpoint record of claim uid " + other_uid +
                         " cannot be used (" + reason +
                         ") and may hold it; make the file readable, or move it out of " +
                         checkpoint_.directory() + " after returning that claim's devices by hand");
  }
  for (const auto& [other_uid, shared] : view.claims) {
    if (other_uid == uid) continue;
    const ClaimRecord& other = *shared;
    for (const PlannedDevice& device : plan) {
      const std::string& name = device.result.device;
      if (device.kind == PlannedKind::kVgpu) {
        const bool held =
            holds_function(other, device.address) ||
            std::any_of(other.vgpus.begin(), other.vgpus.end(),
                        [&](const VgpuRecord& v) { return v.address == device.address; });
        if (held) return HeldByOther(name, "VF " + device.address, other);
      } else if (device.kind == PlannedKind::kPci) {
        for (const std::string& f : device.functions) {
          if (holds_function(other, f)) return HeldByOther(name, "PCI function " + f, other);
          for (const MdevRecord& m : other.mdevs) {
            if (m.parent == f) {
              return HeldByOther(name, "PCI function " + f + " (parent of mdev " + m.uuid + ")",
                                 other);
            }
          }
        }
      } else {
        for (const MdevRecord& m : other.mdevs) {
          if (m.uuid == device.mdev.uuid) {
            return HeldByOther(name, "mdev " + device.mdev.uuid, other);
          }
        }
        if (holds_function(other, device.mdev.parent)) {
          return HeldByOther(name, "its parent " + device.mdev.parent + " (passed through whole)",
                             other);
        }
      }
    }
  }
  return Status::Ok();
}

Status VfioDevicePreparer::CheckNewVgpus(const std::vector<PlannedDevice>& plan,
                                         const std::optional<ClaimRecord>& existing) const {
  for (const PlannedDevice& device : plan) {
    if (device.kind != PlannedKind::kVgpu) continue;
    // A VF the claim's record holds was judged when it was recorded: whatever it holds now is
    // what the record says (a type this claim set before a crash, or the one handed out).
    if (existing && FindVgpu(*existing, device.address) != nullptr) continue;
    // A type the VF holds that no record of ours set (it appeared between publish and prepare)
    // is someone else's: taking it would hand their vGPU out and destroy it at unprepare.
    Status s = MakesVgpu(device) ? vgpus_.CheckFree(device.address)
                                 : vgpus_.CheckHolds(device.address, device.vgpu_type);
    if (!s.ok()) return s.error().Wrap("device " + device.result.device);
  }
  return Status::Ok();
}

Status VfioDevicePreparer::CheckIdentities(const ClaimRecord& record) const {
  std::vector<std::pair<std::string, PciIdentity>> recorded;
  for (const FunctionRecord& f : record.functions) recorded.emplace_back(f.address, f.identity);
  for (const VgpuRecord& v : record.vgpus) recorded.emplace_back(v.address, v.identity);
  for (const auto& [address, identity] : recorded) {
    if (!identity.Known()) continue;
    auto now = ReadIdentity(address);
    if (!now.ok()) {
      return now.error().Wrap("after a reboot, cannot check that " + address +
                              " is still the device that was prepared");
    }
    if (!(*now == identity)) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "after a reboot, PCI " + address + " is " + now->Display() +
                           ", not the device " + identity.Display() +
                           " that was prepared for this claim (the node's PCI addresses "
                           "changed); it cannot be prepared again here: delete the pod so the "
                           "claim is allocated again");
    }
  }
  return Status::Ok();
}

Result<cdi::Device> VfioDevicePreparer::CdiDevice(const std::string& claim_uid,
                                                  const PlannedDevice& device,
                                                  bool& needs_container) {
  cdi::Device out;
  out.name = claim_uid + "-" + device.result.device;
  const IommuInterface iommu = device.config.iommu;
  const bool legacy = iommu != IommuInterface::kIommufd;
  std::optional<int> group = device.iommu_group;
  std::string sysfs_dir = "bus/pci/devices/" + device.address;
  if (device.kind == PlannedKind::kMdev) {
    auto mdev_group = mdevs_.IommuGroup(device.mdev.uuid);
    if (!mdev_group.ok()) return mdev_group.error();
    group = *mdev_group;
    sysfs_dir = "bus/mdev/devices/" + device.mdev.uuid;
  } else if (device.kind == PlannedKind::kVgpu) {
    // The VF's own group (nvidia.ko registers it with VFIO); planned only with one.
  } else if (!group) {
    // No-IOMMU mode: the kernel makes a group when vfio-pci binds the device.
    auto bound = sysfs_.LinkBaseName(sysfs_dir + "/iommu_group");
    if (!bound.ok()) return bound.error().Wrap("device " + device.address + " has no VFIO group");
    auto number = sysfs::ParseDecimalAttribute(*bound);
    if (!number.ok() || *number < 0 || *number > std::numeric_limits<int>::max()) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + device.address + ": its iommu_group link points to \"" +
                           EscapeForDisplay(*bound, 64) + "\", which is not a group number");
    }
    group = static_cast<int>(*number);
  }
  if (legacy) {
    needs_container = true;
    auto node = nodes_.Group(*group);
    if (!node.ok()) return node.error().Wrap("device " + device.result.device);
    out.device_nodes.push_back(CdiNode(*node));
  }
  if (iommu != IommuInterface::kLegacy) {
    auto iommufd = nodes_.Iommufd();
    if (!iommufd.ok()) {
      if (iommu == IommuInterface::kIommufd) {
        return iommufd.error().Wrap("device " + device.result.device +
                                    ": VfioConfig asks for iommuInterface iommufd");
      }
    } else {
      out.device_nodes.push_back(CdiNode(*iommufd));
      std::vector<std::string> dirs;
      if (device.kind != PlannedKind::kPci) {
        dirs.push_back(sysfs_dir);
      } else {
        for (const std::string& f : device.functions) dirs.push_back("bus/pci/devices/" + f);
      }
      for (const std::string& dir : dirs) {
        auto cdevs = nodes_.DeviceCdevs(dir);
        if (!cdevs.ok()) return cdevs.error().Wrap("device " + device.result.device);
        if (cdevs->empty() && iommu == IommuInterface::kIommufd) {
          return MakeError(ErrorKind::kFailedPrecondition,
                           "device " + device.result.device + ": " + sysfs_.Path(dir) +
                               " has no vfio-dev cdev (the kernel lacks "
                               "CONFIG_VFIO_DEVICE_CDEV); use iommuInterface legacy or both");
        }
        for (const auto& cdev : *cdevs) out.device_nodes.push_back(CdiNode(cdev));
      }
    }
  }
  return out;
}

Status VfioDevicePreparer::WriteMetadata(const kube::ResourceClaim& claim,
                                         const std::vector<PlannedDevice>& plan,
                                         const std::map<std::string, std::string>& macs,
                                         std::vector<PreparedDevice>& answer) {
  std::vector<std::string> requests;
  for (const PlannedDevice& device : plan) {
    const std::string request = kube::BaseRequestName(device.result.request);
    if (!Contains(requests, request)) requests.push_back(request);
  }
  for (const std::string& request : requests) {
    cdi::RequestMetadata metadata;
    metadata.claim_namespace = claim.namespace_;
    metadata.claim_name = claim.name;
    metadata.claim_uid = claim.uid;
    metadata.request = request;
    metadata.generation = claim.generation;
    if (auto it = claim.annotations.find(kube::kPodClaimNameAnnotation);
        it != claim.annotations.end()) {
      metadata.pod_claim_name = it->second;
    }
    for (const PlannedDevice& device : plan) {
      if (kube::BaseRequestName(device.result.request) != request) continue;
      cdi::MetadataDevice entry{options_.driver_name, device.result.pool, device.result.device,
                                device.attributes};
      if (auto mac = macs.find(device.result.device); mac != macs.end()) {
        entry.attributes[slicepublisher::attribute::kMacAddress] = {{"string", mac->second}};
      }
      metadata.devices.push_back(std::move(entry));
    }
    Step("metadata:write:" + request);
    auto id = metadata_.Write(metadata);
    if (!id.ok()) return id.error();
    for (PreparedDevice& prepared : answer) {
      if (prepared.request_names.front() == request) {
        prepared.cdi_device_ids.push_back(*id);
        break;
      }
    }
  }
  return Status::Ok();
}

Status VfioDevicePreparer::ApplyDevice(const PlannedDevice& device, const ClaimRecord& record,
                                       std::map<std::string, std::string>& macs,
                                       Deadline deadline) {
  const auto out_of_time = [](const std::string& what) {
    return MakeError(ErrorKind::kDeadlineExceeded,
                     "stopped before " + what +
                         ": the kubelet's deadline for this call is reached; its retry continues "
                         "from here");
  };
  if (device.kind == PlannedKind::kVgpu) {
    const VgpuRecord* recorded = FindVgpu(record, device.address);
    if (recorded == nullptr || recorded->type_id != device.vgpu_type) {
      // A record of another allocation of this claim: what it set is undone by unprepare.
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + device.result.device +
                           ": the claim's checkpoint record holds VF " + device.address +
                           " without vGPU type " + std::to_string(device.vgpu_type) +
                           "; the claim must be unprepared before it is prepared with this type");
    }
    if (!recorded->created_by_us) {
      Status held = vgpus_.CheckHolds(device.address, device.vgpu_type);
      if (!held.ok()) return held.error().Wrap("device " + device.result.device);
      return Status::Ok();
    }
    if (deadline.Expired()) return out_of_time("setting vGPU type on " + device.address);
    Step("vgpu-create:" + device.address);
    // The record, durable before this write, says this claim sets the type: a VF that holds it
    // already is this claim's earlier attempt (killed after the write).
    auto created = Timed("vgpu_create", [&] {
      return vgpus_.Assign(device.address, device.vgpu_type, vfio::VgpuVfLifecycle::Held::kOurs,
                           deadline);
    });
    if (!created.ok()) return created.error().Wrap("device " + device.result.device);
    return Status::Ok();
  }
  if (device.kind == PlannedKind::kMdev) {
    if (!device.mdev_created_by_driver) return Status::Ok();
    if (deadline.Expired()) return out_of_time("creating mdev " + device.mdev.uuid);
    Step("mdev-create:" + device.mdev.uuid);
    auto created = Timed("mdev_create", [&] { return mdevs_.Create(device.mdev); });
    if (!created.ok()) return created.error().Wrap("device " + device.result.device);
    return Status::Ok();
  }
  if (device.vf_link) {
    // Before binding: the PF's driver may reset the VF to apply a MAC, which its VFIO user would
    // see as a device reset.
    if (deadline.Expired()) return out_of_time("configuring " + device.vf_link->Display());
    Step("vf-config:" + device.address);
    auto mac = Timed("vf_config", [&] { return vf_network_.Configure(device); });
    if (!mac.ok()) return mac.error();
    if (*mac) macs[device.result.device] = **mac;
  }
  for (const std::string& address : device.functions) {
    if (deadline.Expired()) return out_of_time("binding " + address);
    Step("bind:" + address);
    if (Status s = Timed(
            "bind",
            [&] { return binder_.BindToVfio(address, VfioDriverOf(device, address), deadline); });
        !s.ok()) {
      return s.error().Wrap("device " + device.result.device);
    }
  }
  return Status::Ok();
}

void VfioDevicePreparer::WriteClaimStatus(const kube::ResourceClaim& claim,
                                          const std::vector<PlannedDevice>& plan,
                                          const std::map<std::string, std::string>& macs) {
  if (options_.claim_status == nullptr) return;
  auto devices = VfNetworkConfigurator::StatusOf(options_.driver_name, claim, plan, macs);
  if (devices.empty()) return;
  // A condition whose status is what the claim already shows keeps its lastTransitionTime. The
  // claim as read for this prepare is the record of it, also across restarts and instances.
  for (kube::AllocatedDeviceStatus& device : devices) {
    for (const kube::AllocatedDeviceStatus& shown : claim.device_statuses) {
      if (shown.driver != device.driver || shown.pool != device.pool ||
          shown.device != device.device || shown.share_id != device.share_id) {
        continue;
      }
      for (kube::DeviceCondition& condition : device.conditions) {
        for (const kube::DeviceCondition& before : shown.conditions) {
          if (before.type == condition.type && before.status == condition.status) {
            condition.last_transition_time = before.last_transition_time;
          }
        }
      }
    }
  }
  Step("claim-status:write");
  options_.claim_status->Submit({claim.api_version, claim.namespace_, claim.name, claim.uid},
                                std::move(devices));
}

void VfioDevicePreparer::ClearClaimStatus(const ClaimRecord& record) {
  if (options_.claim_status == nullptr) return;
  // Entries exist only for network VFs that got settings or have a MAC: after a restart the
  // record tells the first; the queue knows what this process wrote.
  const bool configured_vf = std::any_of(
      record.devices.begin(), record.devices.end(),
      [](const RecordedDevice& d) { return d.vf_link.has_value() && !d.network.Empty(); });
  if (!configured_vf && !options_.claim_status->MayHaveWritten(record.uid)) return;
  options_.claim_status->Submit({"", record.namespace_, record.name, record.uid}, {});
}

Result<std::vector<PreparedDevice>> VfioDevicePreparer::Apply(
    const kube::ResourceClaim& claim, std::vector<PlannedDevice>& plan, const ClaimRecord& record,
    std::map<std::string, std::string>& macs, Deadline deadline) {
  for (const PlannedDevice& device : plan) {
    if (Status s = ApplyDevice(device, record, macs, deadline); !s.ok()) return s.error();
  }

  cdi::Spec spec;
  spec.kind = kind_;
  bool needs_container = false;
  std::vector<PreparedDevice> answer;
  for (const PlannedDevice& device : plan) {
    auto cdi_device = CdiDevice(claim.uid, device, needs_container);
    if (!cdi_device.ok()) return cdi_device.error();
    PreparedDevice prepared;
    prepared.request_names = {kube::BaseRequestName(device.result.request)};
    prepared.pool_name = device.result.pool;
    prepared.device_name = device.result.device;
    prepared.share_id = device.result.share_id;
    prepared.cdi_device_ids = {cdi::QualifiedDeviceId(kind_, cdi_device->name)};
    spec.devices.push_back(std::move(*cdi_device));
    answer.push_back(std::move(prepared));
  }
  if (needs_container) {
    auto container = nodes_.Container();
    if (!container.ok()) return container.error();
    spec.common_device_nodes.push_back(CdiNode(*container));
  }
  Step("cdi:write");
  if (Status s = cdi_.Write(SpecFileName(claim.uid), spec); !s.ok()) return s.error();
  if (Status s = WriteMetadata(claim, plan, macs, answer); !s.ok()) return s.error();
  return answer;
}

std::set<std::string> VfioDevicePreparer::PublishedKeys(
    const std::vector<kube::DeviceRequestAllocationResult>& ours) const {
  std::set<std::string> keys;
  for (const kube::DeviceRequestAllocationResult& result : ours) {
    auto device = published_.Find(result.pool, result.device);
    if (!device) continue;  // the plan says why
    const slicepublisher::PublishedDeviceView view = slicepublisher::DecodePublishedDevice(*device);
    if (view.pci_bus_id) keys.insert(*view.pci_bus_id);
    if (view.parent_pci_address) keys.insert(*view.parent_pci_address);
  }
  return keys;
}

Result<VfioDevicePreparer::PrepareDecision> VfioDevicePreparer::DecidePrepare(
    const kube::ResourceClaim& claim, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    const std::string& who, Deadline deadline) {
  // A view with every record, or an error: without every record, a device held by another
  // claim could be handed out twice.
  const auto checked_view = [&]() -> Result<CheckpointView> {
    // Not noted for health: nothing has changed yet, and Prepare notes the outcome.
    CheckpointView view = checkpoint_.Load();
    for (const std::string& problem : view.problems) {
      log_.Error("prepare checkpoint problem", {{"problem", problem}});
    }
    if (view.listing_error) {
      return MakeError(ErrorKind::kUnavailable, who + ": " + *view.listing_error);
    }
    if (auto it = view.unreadable.find(claim.uid); it != view.unreadable.end()) {
      return MakeError(ErrorKind::kUnavailable, who + ": " + it->second);
    }
    return view;
  };
  bool corrupt_moved_aside = false;
  for (;;) {
    auto decided = locks_.Decision(deadline);
    if (!decided.ok()) return decided.error().Wrap(who + ": not prepared");
    std::optional<FileLock> decision_lock(std::move(*decided));
    PrepareDecision d{{}, {}, std::nullopt, false, false, DeviceLockSet(locks_)};
    // The claim's own record says which devices to lock (and how to replay a completed prepare);
    // the other claims' records are read once the locks are held.
    auto own = checkpoint_.Find(claim.uid);
    if (!own.ok()) {
      if (own.error().kind == ErrorKind::kDataLoss && !corrupt_moved_aside) {
        corrupt_moved_aside = true;
        auto view = checked_view();  // moves the corrupt record aside, saying where
        if (!view.ok()) return view.error();
        continue;
      }
      return MakeError(ErrorKind::kUnavailable, who + ": " + own.error().message);
    }
    std::optional<ClaimRecord> planned_from = std::move(*own);
    // The devices another call may be changing are locked before they are planned, so the plan
    // never reads a device halfway through someone else's bind or restore: first the published
    // functions and the recorded ones, then the rest of the planned IOMMU groups.
    std::set<std::string> keys = PublishedKeys(ours);
    if (planned_from) AddDeviceKeys(*planned_from, keys);
    std::string busy;
    auto all_held = d.devices.TryAdd(keys, busy);
    if (!all_held.ok()) return all_held.error().Wrap(who);
    std::optional<Result<std::vector<PlannedDevice>>> plan;
    if (*all_held) {
      d.was_completed = planned_from && planned_from->state == PrepareState::kPrepareCompleted;
      plan =
          d.was_completed && planned_from->replayable
              ? PlanFromRecord(*planned_from, ours)
              : PlanClaim(claim, ours,
                          PlanContext{
                              options_.driver_name, options_.node_name, published_, sysfs_,
                              [this](const std::string& address) { return binder_.Busy(address); },
                              options_.vfio_drivers.get()});
      if (!plan->ok()) return plan->error().Wrap(who);
      if (!(d.was_completed && planned_from->replayable)) {
        if (Status s = vf_network_.ApplyPodRequests(claim, **plan, deadline); !s.ok()) {
          return s.error().Wrap(who);
        }
      }
      keys.clear();
      AddDeviceKeys(**plan, keys);
      all_held = d.devices.TryAdd(keys, busy);
      if (!all_held.ok()) return all_held.error().Wrap(who);
    }
    if (!*all_held) {
      d.devices.Clear();
      decision_lock.reset();  // nothing is held while this call waits
      if (Status s = locks_.AwaitDevice(busy, deadline); !s.ok()) {
        return s.error().Wrap(who + ": not prepared");
      }
      continue;
    }
    // Every device of the claim is locked: no record that holds one of them can appear, change or
    // go from here on, so this view is the one to judge clashes by. If this claim's own record
    // changed since it was planned from (another call of the claim finished meanwhile), decide
    // again.
    auto view = checked_view();
    if (!view.ok()) return view.error();
    if (const ClaimRecord* existing = view->Find(claim.uid)) d.existing = *existing;
    if (d.existing != planned_from) {
      d.devices.Clear();
      continue;
    }
    d.plan = std::move(**plan);
    if (Status s = CheckOverlap(*view, claim.uid, d.plan); !s.ok()) return s.error().Wrap(who);
    if (Status s = RecordDecision(claim, d, who, deadline); !s.ok()) return s.error();
    return d;
  }
}

namespace {

// A record of an earlier boot knows its VFs' settings and places on their PFs as they were then;
// the PFs' drivers have started their VFs afresh since. What the VFs have now is recorded again
// (RecordStart reads it), and the devices take the places of `plan`, which are this boot's.
void ForgetEarlierBootVfs(const std::vector<PlannedDevice>& plan, ClaimRecord& record) {
  record.vf_networks.clear();
  for (RecordedDevice& recorded : record.devices) {
    for (const PlannedDevice& device : plan) {
      if (device.result.request == recorded.request && device.result.pool == recorded.pool &&
          device.result.device == recorded.device) {
        recorded.vf_link = device.vf_link;
      }
    }
  }
}

}  // namespace

Status VfioDevicePreparer::RecordDecision(const kube::ResourceClaim& claim, PrepareDecision& d,
                                          const std::string& who, Deadline deadline) {
  const bool earlier_boot = d.existing && d.existing->boot_id != checkpoint_.boot_id();
  if (earlier_boot) {
    if (Status s = CheckIdentities(*d.existing); !s.ok()) return s.error().Wrap(who);
    if (Status s = RelinkVfs(sysfs_, d.plan); !s.ok()) {
      return s.error().Wrap(who + ": after a reboot");
    }
  }
  d.record = d.existing ? *d.existing : ClaimRecord{};
  if (earlier_boot) ForgetEarlierBootVfs(d.plan, d.record);
  // As the checkpoint stamps it: a rollback of this prepare must not take it for an earlier
  // boot's record (which would skip removing the mdevs and restoring the VF settings it made).
  d.record.boot_id = checkpoint_.boot_id();
  if (!d.was_completed) d.record.state = PrepareState::kPrepareStarted;
  d.changed = !d.existing || earlier_boot;
  if (Status s = CheckNewVgpus(d.plan, d.existing); !s.ok()) return s.error().Wrap(who);
  if (Status s = RecordStart(claim, d.plan, d.record, d.changed, deadline); !s.ok()) {
    return s.error().Wrap(who + ": cannot record the prepare in the checkpoint");
  }
  if (d.changed) {
    // Visible to every other call from here on; made durable by Prepare before the node is
    // touched.
    Step("checkpoint:started");
    if (Status s = checkpoint_.Stage(d.record); !s.ok()) {
      return s.error().Wrap(who + ": cannot record the prepare in the checkpoint");
    }
  }
  return Status::Ok();
}

Result<std::vector<PreparedDevice>> VfioDevicePreparer::Prepare(
    const kube::ResourceClaim& claim, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    Deadline deadline) {
  const std::string who = "claim " + claim.namespace_ + "/" + claim.name;
  if (!IsObjectUid(claim.uid)) {
    return MakeError(ErrorKind::kInvalidArgument, who + ": uid is not a valid object UID");
  }
  if (deadline.Expired()) {
    return MakeError(ErrorKind::kDeadlineExceeded,
                     who +
                         ": not started: the kubelet's deadline for this call has passed; its "
                         "retry prepares the claim");
  }
  auto call_lock = locks_.Call(deadline);
  if (!call_lock.ok()) return call_lock.error().Wrap(who + ": not prepared");
  auto decided = DecidePrepare(claim, ours, who, deadline);
  if (!decided.ok()) return decided.error();
  PrepareDecision& d = *decided;
  if (d.changed) {
    // Durable before the node is touched. On failure the staged record stays: it records nothing
    // done yet, and the kubelet's retry (or recovery) goes on from it.
    if (Status s = checkpoint_.Commit(claim.uid); !s.ok()) {
      return s.error().Wrap(who + ": cannot record the prepare in the checkpoint");
    }
  }

  // Only this call's device locks are held from here: claims on other devices go on meanwhile.
  std::map<std::string, std::string> macs;
  auto answer = Apply(claim, d.plan, d.record, macs, deadline);
  if (!answer.ok()) {
    Error error = answer.error().Wrap(who);
    if (!d.was_completed && !deadline.Expired()) {
      // Leave the node as it was: nothing of a failed first prepare may linger. (When the
      // deadline ran out the record stays: the kubelet's retry or unprepare finishes the job.)
      if (Status undo = Undo(d.record, deadline); !undo.ok()) {
        error.message += "; rolling back also failed: " + undo.error().message +
                         " (unprepare or a restart will retry)";
      }
    }
    Refresh();
    return error;
  }
  ClaimRecord completed = std::move(d.record);  // d.record is not used again
  completed.state = PrepareState::kPrepareCompleted;
  for (size_t i = 0; i < answer->size() && i < completed.devices.size(); ++i) {
    completed.devices[i].cdi_device_ids = (*answer)[i].cdi_device_ids;
  }
  std::shared_ptr<const ClaimRecord> noted;
  if (!d.was_completed || d.changed || !(completed == *d.existing)) {
    Step("checkpoint:completed");
    auto written = checkpoint_.Put(std::move(completed));
    if (!written.ok()) return written.error().Wrap(who + ": cannot record the completed prepare");
    noted = std::move(*written);
  } else {
    noted = std::make_shared<const ClaimRecord>(std::move(completed));
  }
  // Only this claim's record changed: the snapshots need no re-read of every record (the other
  // instance's changes come with the next Refresh).
  NoteClaim(claim.uid, std::move(noted));
  // The devices are prepared: the status is written in the background, and its fate does not
  // change this answer (see docs/preparation.md).
  WriteClaimStatus(claim, d.plan, macs);
  Step("prepare:done");
  return std::move(*answer);
}

void VfioDevicePreparer::RestoreFunctions(
    const ClaimRecord& record, bool earlier_boot, Deadline deadline,
    const std::function<void(const Error&)>& note,
    const std::function<bool(const std::string&)>& out_of_time) {
  // A network VF's settings go back while it is on no driver: after VFIO let it go (a VF a VM
  // still holds keeps what the VM was given, and the retry restores it), and before its host
  // driver probes (drivers read the VF's MAC then).
  const auto restore_vf = [&](const VfNetworkRecord& vf) {
    if (out_of_time("restoring the settings of " + vf.link.Display())) return false;
    Step("vf-restore:" + vf.address);
    if (Status s = Timed("vf_restore", [&] { return vf_network_.Restore(vf, earlier_boot); });
        !s.ok()) {
      note(s.error());
    }
    return true;
  };
  std::set<std::string> handled;  // functions whose VF settings go with them
  for (auto it = record.functions.rbegin(); it != record.functions.rend(); ++it) {
    handled.insert(it->address);
    if (earlier_boot && it->identity.Known()) {
      auto now = ReadIdentity(it->address);
      if (now.ok() && !(*now == it->identity)) {
        log_.Warn("not restoring a function that is now another device",
                  {{"claim", record.Display()},
                   {"function", it->address},
                   {"recorded", it->identity.Display()},
                   {"now", now->Display()}});
        continue;
      }
    }
    if (out_of_time("restoring " + it->address)) return;
    Step("restore:" + it->address);
    const auto released = [&] {
      for (auto vf = record.vf_networks.rbegin(); vf != record.vf_networks.rend(); ++vf) {
        if (vf->address == it->address && !restore_vf(*vf)) return;
      }
    };
    auto warning =
        Timed("restore", [&] { return binder_.Restore(it->Binding(), deadline, released); });
    if (!warning.ok()) {
      note(warning.error());
    } else if (!warning->empty()) {
      log_.Warn("device not fully restored", {{"claim", record.Display()}, {"warning", *warning}});
    }
  }
  // A VF whose function the record does not hold has no driver to wait for.
  for (auto it = record.vf_networks.rbegin(); it != record.vf_networks.rend(); ++it) {
    if (handled.count(it->address) == 0 && !restore_vf(*it)) return;
  }
}

Status VfioDevicePreparer::Undo(const ClaimRecord& record, Deadline deadline) {
  const std::string who = record.Display();
  // After a reboot the node lost the bindings and mdevs, and addresses may name other devices.
  const bool earlier_boot = record.boot_id != checkpoint_.boot_id();
  std::optional<Error> first;
  auto note = [&](const Error& e) {
    log_.Error("undo step failed", {{"claim", who}, {"error", e.message}});
    if (!first) first = e;
  };
  auto out_of_time = [&](const std::string& what) {
    if (!deadline.Expired()) return false;
    note(MakeError(ErrorKind::kDeadlineExceeded,
                   "stopped before " + what +
                       ": the kubelet's deadline for this call is reached; its retry continues"));
    return true;
  };
  Step("cdi:remove");
  // The CDI specs the record names, then every metadata file of the claim (some may not be named:
  // a prepare killed midway), with one listing of the CDI directory.
  if (Status s = metadata_.RemoveClaim(record.namespace_, record.name, record.uid,
                                       {record.cdi_files.rbegin(), record.cdi_files.rend()});
      !s.ok()) {
    note(s.error());
  }
  // What prepare created in this boot goes; after a reboot it is gone already, and whatever is in
  // its place now was not made for this claim. False when the deadline stops the rest.
  const auto remove_created = [&](const std::string& what, const std::string& step,
                                  const char* operation, const std::function<Status()>& remove) {
    if (earlier_boot) {
      log_.Info("not removing " + what + ": created before the node rebooted", {{"claim", who}});
      return true;
    }
    if (out_of_time("removing " + what)) return false;
    Step(step);
    if (Status s = Timed(operation, remove); !s.ok()) note(s.error());
    return true;
  };
  for (auto it = record.mdevs.rbegin(); it != record.mdevs.rend(); ++it) {
    if (it->created_by_us &&
        !remove_created("mdev " + it->uuid, "mdev-remove:" + it->uuid, "mdev_remove",
                        [&] { return mdevs_.Remove(it->uuid, deadline); })) {
      break;
    }
  }
  for (auto it = record.vgpus.rbegin(); it != record.vgpus.rend(); ++it) {
    if (it->created_by_us &&
        !remove_created("the vGPU on " + it->address, "vgpu-remove:" + it->address, "vgpu_remove",
                        [&] { return vgpus_.Clear(it->address, it->type_id, deadline); })) {
      break;
    }
  }
  RestoreFunctions(record, earlier_boot, deadline, note, out_of_time);
  if (first) return first->Wrap(who + ": unprepare is incomplete");
  Step("checkpoint:remove");
  if (Status removed = checkpoint_.Remove(record.uid); !removed.ok()) {
    return removed.error().Wrap(who);
  }
  Step("unprepare:done");
  return Status::Ok();
}

Status VfioDevicePreparer::Unprepare(const ClaimRef& claim, Deadline deadline) {
  const std::string who = "claim " + claim.Display();
  auto call_lock = locks_.Call(deadline);
  if (!call_lock.ok()) return call_lock.error().Wrap(who + ": not unprepared");
  // The claim's own record, read directly: only a record that is really absent means "never
  // prepared, or already undone".
  const auto read_record = [&]() -> Result<std::optional<ClaimRecord>> {
    auto found = checkpoint_.Find(claim.uid);
    if (found.ok()) return found;
    if (found.error().kind == ErrorKind::kDataLoss) {
      // A corrupt record cannot be undone automatically: LoadView moves it aside (the log says
      // where), this answer tells the kubelet once, and its retry then finds nothing to do.
      LoadView();
      return found.error().Wrap(who + ": its devices must be checked and returned by hand");
    }
    return MakeError(ErrorKind::kUnavailable,
                     who + ": " + found.error().message + "; the record is kept and retried");
  };
  DeviceLockSet devices(locks_);
  std::optional<ClaimRecord> record;
  for (;;) {
    auto decided = locks_.Decision(deadline);
    if (!decided.ok()) return decided.error().Wrap(who + ": not unprepared");
    std::optional<FileLock> decision_lock(std::move(*decided));
    auto found = read_record();
    if (!found.ok()) return found.error();
    if (!found->has_value()) return Status::Ok();
    std::set<std::string> keys;
    AddDeviceKeys(**found, keys);
    std::string busy;
    auto all_held = devices.TryAdd(keys, busy);
    if (!all_held.ok()) return all_held.error().Wrap(who + ": not unprepared");
    if (*all_held) {
      // The record is only changed under these locks: read under them, it is the one to undo. A
      // call of this claim that finished while they were taken means: look again.
      auto locked = read_record();
      if (!locked.ok()) return locked.error();
      if (!locked->has_value()) return Status::Ok();
      if (**locked == **found) {
        record = std::move(**locked);
        break;
      }
      devices.Clear();
      continue;
    }
    // A prepare of this claim (a retry in flight) or of a claim on the same device is running:
    // undo what it leaves, not a record it is still writing.
    devices.Clear();
    decision_lock.reset();
    if (Status s = locks_.AwaitDevice(busy, deadline); !s.ok()) {
      return s.error().Wrap(who + ": not unprepared");
    }
  }
  Status status = Undo(*record, deadline);
  NoteClaimOnDisk(claim.uid);
  if (status.ok()) ClearClaimStatus(*record);
  if (status.ok() && options_.after_unprepare) options_.after_unprepare();
  return status;
}

Status VfioDevicePreparer::RollBackInterrupted(const ClaimRecord& seen) {
  const std::string who = seen.namespace_ + "/" + seen.name;
  DeviceLockSet devices(locks_);
  std::set<std::string> keys;
  AddDeviceKeys(seen, keys);
  std::string busy;
  auto all_held = devices.TryAdd(keys, busy);
  if (!all_held.ok()) return all_held.error().Wrap(seen.Display());
  if (!*all_held) {
    // Its devices are locked: the instance that wrote it is alive and still preparing it.
    log_.Info("leaving a prepare in flight in another instance",
              {{"claim", who}, {"uid", seen.uid}, {"busy device", busy}});
    return Status::Ok();
  }
  // Records are written only under the locks of their devices: read now, this one is current. A
  // record that changed since it was seen was worked on meanwhile (completed, undone, or prepared
  // again by a retry): whoever did that, or the kubelet's next call, finishes it.
  auto now = checkpoint_.Find(seen.uid);
  if (!now.ok()) return now.error().Wrap("not rolled back: " + seen.Display());
  if (!now->has_value() || !(**now == seen)) {
    const std::string state = !now->has_value() ? "no record"
                              : (*now)->state == PrepareState::kPrepareCompleted
                                  ? "PrepareCompleted"
                                  : "PrepareStarted, changed";
    log_.Info("not rolling back a prepare that another call finished or changed meanwhile",
              {{"claim", who}, {"uid", seen.uid}, {"now", state}});
    return Status::Ok();
  }
  log_.Info("rolling back a prepare interrupted by a restart", {{"claim", who}, {"uid", seen.uid}});
  return Undo(**now, Deadline());
}

Status VfioDevicePreparer::Recover() {
  // Another instance (a rolling update) may be working on the node: recovery holds prepare.lock
  // exclusively (no decision is half made meanwhile) and only undoes records whose devices nobody
  // holds.
  auto call_lock = locks_.Call(Deadline());
  if (!call_lock.ok()) return call_lock.error().Wrap("recovering from the prepare checkpoint");
  auto decision_lock = locks_.Recovery(Deadline());
  if (!decision_lock.ok()) {
    return decision_lock.error().Wrap("recovering from the prepare checkpoint");
  }
  std::optional<Error> first;
  std::string problem;
  auto upgraded = checkpoint_.Upgrade(&problem);
  if (!problem.empty()) log_.Error("prepare checkpoint moved aside", {{"problem", problem}});
  if (!upgraded.ok()) {
    first = upgraded.error();
  } else if (*upgraded > 0) {
    log_.Info("upgraded the prepare checkpoint to one record per claim",
              {{"claims", std::to_string(*upgraded)}, {"directory", checkpoint_.directory()}});
  }
  const CheckpointView view = LoadView();
  for (const auto& [uid, shared] : view.claims) {
    if (shared->state != PrepareState::kPrepareStarted) continue;
    // Another instance may finish (or retry) this prepare between the view and the locks: only
    // the record read under the locks says what to do.
    Step("recover:" + uid);
    if (Status s = RollBackInterrupted(*shared); !s.ok() && !first) first = s.error();
  }
  // CDI specs of ours that no claim owns (left by a checkpoint that was lost) would inject
  // devices nobody prepared; metadata specs go with them. Specs of a claim whose record cannot be
  // read now are kept.
  const CheckpointView after = LoadView();
  if (after.listing_error) {
    // Without every record, any file could be a prepared claim's: nothing is swept.
    const Error error = MakeError(ErrorKind::kUnavailable, *after.listing_error);
    return (first ? *first : error).Wrap("recovering from the prepare checkpoint");
  }
  std::set<std::string> owned;
  for (const auto& [uid, record] : after.claims) {
    owned.insert(record->cdi_files.begin(), record->cdi_files.end());
  }
  const auto unreadable_owner = [&](const std::string& file) {
    for (const auto& [uid, reason] : after.unreadable) {
      if (file.find(uid) != std::string::npos) return true;
    }
    return false;
  };
  const std::string spec_prefix = SpecFileName("");
  const std::string metadata_prefix = options_.driver_name + "_metadata_";
  for (const std::string& prefix :
       {spec_prefix.substr(0, spec_prefix.size() - 5), metadata_prefix}) {
    auto files = cdi_.List(prefix);
    if (!files.ok()) {
      if (!first) first = files.error();
      continue;
    }
    for (const std::string& file : *files) {
      if (owned.count(file) != 0 || unreadable_owner(file)) continue;
      log_.Warn("removing a CDI spec no prepared claim owns", {{"file", cdi_.PathOf(file)}});
      if (Status s = cdi_.Remove(file); !s.ok() && !first) first = s.error();
    }
  }
  // KubeVirt metadata files of claims without a record: a record is made before any file of its
  // prepare, so these are leftovers (of a lost checkpoint, or of an unprepare by an older version
  // that knew only the previous layout of these files).
  if (auto uids = metadata_.ClaimUidsOnDisk(); !uids.ok()) {
    if (!first) first = uids.error();
  } else {
    for (const std::string& uid : *uids) {
      if (after.claims.count(uid) != 0 || after.unreadable.count(uid) != 0) continue;
      log_.Warn("removing KubeVirt metadata files no prepared claim owns", {{"claim uid", uid}});
      if (Status s = metadata_.RemoveHostFiles(uid); !s.ok() && !first) first = s.error();
    }
  }
  Refresh();
  if (first) return first->Wrap("recovering from the prepare checkpoint");
  return Status::Ok();
}

}  // namespace vfio_dra::prepare
