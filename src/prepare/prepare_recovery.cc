// Start-up recovery: the version-1 checkpoint upgraded, each prepare a crash left in
// PrepareStarted rolled back (unless the instance that wrote it still holds its devices), and the
// CDI specs and KubeVirt metadata files no record owns removed.
#include <set>

#include "prepare/device_lock_keys.h"
#include "prepare/vfio_device_preparer.h"

namespace vfio_dra::prepare {

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

}  // namespace vfio_dra::prepare
