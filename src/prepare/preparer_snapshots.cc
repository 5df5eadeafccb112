// VfioDevicePreparer's snapshots of the checkpoint for other threads (metrics, the health stream,
// discovery): the records as last loaded, with each claim a call changed since noted over them,
// rebuilt into counts, prepared targets and held functions only when next asked for.
#include "prepare/vfio_device_preparer.h"

namespace vfio_dra::prepare {

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

}  // namespace vfio_dra::prepare
