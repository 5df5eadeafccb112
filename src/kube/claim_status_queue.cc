#include "kube/claim_status_queue.h"

#include <system_error>

#include "base/thread_name.h"

namespace vfio_dra::kube {
namespace {

std::string ClaimName(const ClaimStatusTarget& claim) {
  return claim.namespace_ + "/" + claim.name;
}

// Refusals no retry can change: the entries are invalid, or the claim's API version is gone.
bool IsFinal(ErrorKind kind) {
  return kind == ErrorKind::kInvalidArgument || kind == ErrorKind::kFailedPrecondition;
}

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
                              std::vector<AllocatedDeviceStatus> devices) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  auto [it, added] = pending_.try_emplace(
      claim.uid,
      Pending{claim,
              {},
              0,
              {},
              Backoff(options_.first_retry, options_.max_retry, 0.2, options_.jitter_seed)});
  Pending& pending = it->second;
  if (!added) {
    KeepTransitionTimes(devices, pending.devices);
    // A claim read in another API version is the same claim: the newest reading names it.
    pending.claim = claim;
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
    const uint64_t version = next->version;
    lock.unlock();
    const Status status = writer_.Apply(claim, devices, Deadline::After(options_.write_timeout));
    lock.lock();
    Finish(uid, version, status);
  }
  worker_running_ = false;
  settled_.notify_all();
}

void ClaimStatusQueue::Finish(const std::string& uid, uint64_t version, const Status& status) {
  auto it = pending_.find(uid);
  if (it == pending_.end()) return;  // dropped by Stop
  Pending& pending = it->second;
  pending.in_flight = false;
  const bool stale = pending.version != version;
  const std::string claim = ClaimName(pending.claim);
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
      with_entries_[uid] = pending.claim.api_version;
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
