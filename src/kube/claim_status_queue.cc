#include "kube/claim_status_queue.h"

#include <system_error>

#include "base/thread_name.h"

namespace vfio_dra::kube {
namespace {

std::string ClaimName(const ClaimStatusTarget& claim) {
  return claim.namespace_ + "/" + claim.name;
}

// Refusals no retry can change: the entries are invalid, or no API version of claims is served.
bool IsFinal(ErrorKind kind) {
  return kind == ErrorKind::kInvalidArgument || kind == ErrorKind::kFailedPrecondition;
}

// Readings an attempt takes at most: a conflict each time means another writer is busy with the
// claim, and the back-off waits for it.
constexpr int kReadings = 3;

std::string Milliseconds(std::chrono::milliseconds delay) {
  return std::to_string(delay.count()) + "ms";
}

// A condition whose status did not change keeps its lastTransitionTime (metav1.Condition).
void KeepTransitionTimes(std::vector<AllocatedDeviceStatus>& devices,
                         const std::vector<AllocatedDeviceStatus>& before) {
  for (AllocatedDeviceStatus& device : devices) {
    for (const AllocatedDeviceStatus& old : before) {
      if (old.pool != device.pool || old.device != device.device ||
          old.share_id != device.share_id) {
        continue;
      }
      for (DeviceCondition& condition : device.conditions) {
        if (!condition.last_transition_time.empty()) continue;
        for (const DeviceCondition& previous : old.conditions) {
          if (previous.type == condition.type && previous.status == condition.status) {
            condition.last_transition_time = previous.last_transition_time;
          }
        }
      }
    }
  }
}

}  // namespace

ClaimStatusQueue::ClaimStatusQueue(ClaimStatusWriter& writer, Clock& clock, Logger log,
                                   ClaimStatusQueueOptions options)
    : writer_(writer), clock_(clock), log_(std::move(log)), options_(options) {}

ClaimStatusQueue::~ClaimStatusQueue() { Stop(); }

void ClaimStatusQueue::Submit(const ClaimStatusTarget& claim,
                              std::vector<AllocatedDeviceStatus> devices,
                              std::function<bool()> wanted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  auto [it, added] = pending_.try_emplace(
      claim.uid,
      Pending{claim,
              {},
              {},
              0,
              {},
              Backoff(options_.first_retry, options_.max_retry, 0.2, options_.jitter_seed)});
  Pending& pending = it->second;
  if (!added) {
    KeepTransitionTimes(devices, pending.devices);
    // A claim read in another API version is the same claim: the newest reading names it. A
    // clearing knows no version: the one the replaced write was read in still serves.
    const std::string known = pending.claim.api_version;
    pending.claim = claim;
    if (pending.claim.api_version.empty()) pending.claim.api_version = known;
  }
  // Stamped now, not when the write lands: the condition changed when the prepare finished.
  const std::string now = FormatRfc3339(std::chrono::system_clock::now());
  for (AllocatedDeviceStatus& device : devices) {
    for (DeviceCondition& condition : device.conditions) {
      if (condition.last_transition_time.empty()) condition.last_transition_time = now;
    }
  }
  if (pending.claim.api_version.empty()) {
    // An unprepare knows no API version: the one the entries were written in still serves.
    if (auto known = with_entries_.find(claim.uid); known != with_entries_.end()) {
      pending.claim.api_version = known->second;
    }
  }
  pending.devices = std::move(devices);
  pending.wanted = std::move(wanted);
  pending.version = ++next_version_;
  // New content is tried at once, even while older content waited for its retry.
  pending.due = clock_.Now();
  EnsureWorker();
  wake_.notify_all();
}

bool ClaimStatusQueue::MayHaveWritten(const std::string& claim_uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.count(claim_uid) != 0 || with_entries_.count(claim_uid) != 0;
}

void ClaimStatusQueue::EnsureWorker() {
  if (worker_running_) return;
  // A worker that found nothing to do has ended (it cleared worker_running_ as it left, holding
  // mu_): joining it here does not wait.
  if (worker_.joinable()) worker_.join();
  try {
    worker_ = std::thread([this] {
      NameThisThread("claim-status");
      Run();
    });
    worker_running_ = true;
  } catch (const std::system_error& e) {
    // The writes stay pending; the next Submit tries to start the worker again.
    log_.Error("cannot start the claim status writer thread; claim statuses are behind",
               {{"error", e.what()}, {"pending", std::to_string(pending_.size())}});
  }
}

ClaimStatusQueue::Pending* ClaimStatusQueue::NextDue(std::string& uid) {
  Pending* next = nullptr;
  for (auto& [key, pending] : pending_) {
    if (pending.in_flight || (next != nullptr && next->due <= pending.due)) continue;
    next = &pending;
    uid = key;
  }
  return next;
}

void ClaimStatusQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    std::string uid;
    Pending* next = NextDue(uid);
    if (next == nullptr) break;
    if (next->due > clock_.Now()) {
      settled_.notify_all();
      clock_.WaitUntil(wake_, lock, next->due);
      continue;
    }
    next->in_flight = true;
    const ClaimStatusTarget claim = next->claim;
    const std::vector<AllocatedDeviceStatus> devices = next->devices;
    const std::function<bool()> wanted = next->wanted;
    const uint64_t version = next->version;
    lock.unlock();
    const Outcome outcome = Attempt(claim, devices, wanted);
    lock.lock();
    Finish(uid, version, outcome);
  }
  worker_running_ = false;
  settled_.notify_all();
}

ClaimStatusQueue::Outcome ClaimStatusQueue::Attempt(
    ClaimStatusTarget claim, const std::vector<AllocatedDeviceStatus>& devices,
    const std::function<bool()>& wanted) {
  const Deadline deadline = Deadline::After(options_.write_timeout);
  Outcome outcome;
  for (int reading = 0; reading < kReadings; ++reading) {
    if (claim.resource_version.empty()) {
      auto now = writer_.Read(claim, deadline);
      if (!now.ok()) {
        outcome.status = now.error();
        break;
      }
      claim.api_version = now->api_version;
      claim.resource_version = now->resource_version;
      // Already there (an earlier attempt landed though its answer was lost), or nothing of ours
      // to clear: no write.
      if (SameDeviceStatuses(now->ours, devices)) {
        outcome.status = Status::Ok();
        break;
      }
    }
    // Asked last, just before the write: the other instance may have unprepared the claim while
    // this one read it (and a change it makes to the claim after this fails the precondition).
    if (wanted && !wanted()) {
      outcome.unwanted = true;
      break;
    }
    outcome.status = writer_.Apply(claim, devices, deadline);
    if (outcome.status.ok()) break;
    const ErrorKind kind = outcome.status.error().kind;
    if (kind != ErrorKind::kConflict && kind != ErrorKind::kFailedPrecondition) break;
    // Read again, in the newest version served when this one is not.
    claim.resource_version.clear();
    if (kind == ErrorKind::kFailedPrecondition) claim.api_version.clear();
  }
  outcome.claim = std::move(claim);
  return outcome;
}

void ClaimStatusQueue::Finish(const std::string& uid, uint64_t version, const Outcome& outcome) {
  auto it = pending_.find(uid);
  if (it == pending_.end()) return;  // dropped by Stop
  Pending& pending = it->second;
  pending.in_flight = false;
  const bool stale = pending.version != version;
  const std::string claim = ClaimName(pending.claim);
  if (outcome.unwanted) {
    ++stats_.given_up;
    log_.Info(
        "claim status not written: the node no longer holds the claim as this write says (it "
        "was prepared or unprepared since, by this instance or the other of a rolling update)",
        {{"claim", claim}, {"uid", uid}});
    if (!stale) pending_.erase(it);
    return;
  }
  const Status& status = outcome.status;
  if (status.ok()) {
    ++stats_.written;
    if (pending.failures > 0) {
      log_.Info("claim status written after failing",
                {{"claim", claim}, {"failed attempts", std::to_string(pending.failures)}});
      pending.failures = 0;
    }
    // What the claim holds now is what this write applied.
    if (stale) return;
    if (pending.devices.empty()) {
      with_entries_.erase(uid);
    } else {
      with_entries_[uid] = outcome.claim.api_version;
    }
    pending_.erase(it);
    return;
  }
  const Error& error = status.error();
  if (error.kind == ErrorKind::kNotFound || IsFinal(error.kind)) {
    ++stats_.given_up;
    if (error.kind == ErrorKind::kNotFound) {
      log_.Info("claim status not written: the claim is gone",
                {{"claim", claim}, {"error", error.message}});
      with_entries_.erase(uid);
    } else {
      log_.Error("claim status not written: the API server refuses it for good",
                 {{"claim", claim}, {"error", error.message}});
    }
    if (!stale || error.kind == ErrorKind::kNotFound) pending_.erase(it);
    return;
  }
  ++stats_.failed;
  // A newer write of the claim is due at once; this content is not tried again.
  if (stale) return;
  // The retry starts from the last reading (a transient failure keeps its precondition).
  pending.claim = outcome.claim;
  const std::chrono::milliseconds delay = pending.backoff.Next();
  pending.due = clock_.Now() + delay;
  if (pending.failures++ == 0) {
    log_.Warn(
        "cannot write the claim's status; retrying in the background",
        {{"claim", claim}, {"error", error.message}, {"next attempt in", Milliseconds(delay)}});
  }
}

void ClaimStatusQueue::Stop() {
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    worker = std::move(worker_);
  }
  wake_.notify_all();
  if (worker.joinable()) worker.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [uid, pending] : pending_) {
    log_.Warn("claim status not written before the plugin stopped; its next prepare writes it",
              {{"claim", ClaimName(pending.claim)}, {"uid", uid}});
  }
  pending_.clear();
  settled_.notify_all();
}

ClaimStatusQueueStats ClaimStatusQueue::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClaimStatusQueueStats stats = stats_;
  stats.pending = pending_.size();
  return stats;
}

bool ClaimStatusQueue::WaitUntilSettled(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return settled_.wait_for(lock, timeout, [&] {
    const auto now = clock_.Now();
    for (const auto& [uid, pending] : pending_) {
      if (pending.in_flight || pending.due <= now) return false;
    }
    return true;
  });
}

}  // namespace vfio_dra::kube
