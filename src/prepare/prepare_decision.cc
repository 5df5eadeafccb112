// VfioDevicePreparer::Prepare and its decision: lock the claim's devices, plan (or replay the
// claim's record), refuse clashes (prepare_checks.cc), record PrepareStarted with what undoing it
// needs, then apply (prepare_apply.cc) and record PrepareCompleted; a failed first prepare is
// rolled back (prepare_undo.cc).
#include <algorithm>
#include <set>

#include "base/k8s_names.h"
#include "prepare/device_lock_keys.h"
#include "prepare/vfio_device_preparer.h"
#include "slicepublisher/device_attributes.h"

namespace vfio_dra::prepare {
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
              ? PlanFromRecord(*planned_from, ours, sysfs_)
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
    // A completed prepare is repeated without new work on the node (unless it was of an earlier
    // boot, which RecordDecision replays); a new one must not start what it cannot finish.
    if (!d.was_completed || d.existing->boot_id != checkpoint_.boot_id()) {
      if (Status s = CheckPrivilegesOf(d.plan); !s.ok()) return s.error().Wrap(who);
    }
    if (Status s = CheckOverlap(*view, claim.uid, d.plan); !s.ok()) return s.error().Wrap(who);
    if (Status s = RecordDecision(claim, d, who, deadline); !s.ok()) return s.error();
    return d;
  }
}

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
    // Written before the node is touched, and visible to every other call from here on. Not
    // forced to disk: a power loss that loses it reboots the node, undoing all it records.
    Step("checkpoint:started");
    if (auto written = checkpoint_.Put(d.record); !written.ok()) {
      return written.error().Wrap(who + ": cannot record the prepare in the checkpoint");
    }
  }
  return Status::Ok();
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
      auto link = ReadVfLink(sysfs_, device.address);
      if (!link.ok()) return link.error().Wrap("device " + device.result.device);
      // CheckNewVgpus found the VF as the plan needs it. Only a vGPU this claim makes is removed
      // at unprepare; one handed out as it was stays.
      record.vgpus.push_back({device.address, device.vgpu_type, MakesVgpu(device),
                              std::move(*identity), std::move(link->pf_device)});
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
    if (std::ranges::find(files, file) == files.end()) files.push_back(file);
  }
  for (const std::string& file : files) {
    if (std::ranges::find(record.cdi_files, file) == record.cdi_files.end()) {
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

}  // namespace vfio_dra::prepare
