// The undo path: Unprepare locks a claim's recorded devices and undoes its record; Undo (also
// the rollback of a failed first prepare and of an interrupted one at start) removes the CDI specs
// and metadata, the mdevs and vGPUs vfio-dra made, and returns each function and VF network
// setting to what the record says it was, in reverse order, then drops the record. It keeps going
// past failures and keeps the record while anything is left.
#include <algorithm>
#include <set>

#include "prepare/device_lock_keys.h"
#include "prepare/vfio_device_preparer.h"

namespace vfio_dra::prepare {

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
  // A VF that is gone took its vGPU with it: done, as a function that is gone is
  // (VfioPciBinder::Restore), with a warning that says what was not there.
  const auto clear_vgpu = [&](const VgpuRecord& vgpu) -> Status {
    auto warning = vgpus_.Clear(vgpu.address, vgpu.type_id, deadline);
    if (!warning.ok()) return warning.error();
    if (!warning->empty()) log_.Warn("vGPU not removed", {{"claim", who}, {"warning", *warning}});
    return Status::Ok();
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
                        [&] { return clear_vgpu(*it); })) {
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

void VfioDevicePreparer::ClearClaimStatus(const ClaimRecord& record) {
  if (options_.claim_status == nullptr) return;
  // Entries exist only for network VFs (that got settings, or whose MAC was reported): after a
  // restart the record tells which devices are VFs; the queue knows what this process wrote.
  const bool vf = std::any_of(record.devices.begin(), record.devices.end(),
                              [](const RecordedDevice& d) { return d.vf_link.has_value(); });
  if (!vf && !options_.claim_status->MayHaveWritten(record.uid)) return;
  options_.claim_status->Submit({"", record.namespace_, record.name, record.uid, ""}, {},
                                [checkpoint = checkpoint_, uid = record.uid] {
                                  auto prepared = checkpoint.Find(uid);
                                  return !prepared.ok() || !prepared->has_value();
                                });
}

}  // namespace vfio_dra::prepare
