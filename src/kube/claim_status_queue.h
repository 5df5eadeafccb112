// ClaimStatusQueue: writes claims' status.devices entries in the background, retrying with
// back-off until each write lands, so that a prepare that did its work answers the kubelet at
// once whatever the API server does with the status (it is information for the cluster, not a
// condition for the VM to run).
//
// Per claim (by UID) only the newest content is kept: a Submit replaces a write still pending, and
// a write in flight when a newer one arrives is neither retried nor allowed to follow the newer
// one (writes of one claim never overlap, so a stale retry cannot overtake an unprepare's
// clearing). A write keeps the API version the claim was read in, also when a clearing that knows
// none replaces it; one that knows none reads the claim in the newest version served.
//
// Another process may write the same entries (the other instance of a rolling update, or this
// one before a restart): every write is decided on a reading of the claim and carries that
// reading's resourceVersion as a precondition, so it never lands over a newer decision. A write
// without a reading yet (a clearing) reads the claim first, and writes nothing when the claim
// already shows what it would write. A conflict (409) reads again and decides again. Before each
// write the submitter's `wanted` is asked whether the content is still what the node holds (the
// claim's record in the checkpoint both instances share): an older instance's write of a claim the
// newer one unprepared since is dropped, not written.
//
// A write ends when it lands, when the claim is gone (404, or the UID differs: re-created under
// the name), when it is no longer wanted, or when the server refuses it for good (invalid content,
// no API version served). Transient failures (outage, 403 while RBAC is fixed, the admission
// policy) are retried from 1 s, doubling to 5 min. The log has one line when a claim's write
// starts failing and one when it lands after all, not one per retry.
//
// A worker thread runs only while writes are pending (an idle daemon keeps none); the owner joins
// it in Stop. Writes still pending at Stop are dropped and logged: the next prepare of the claim
// (the kubelet's, after a restart of its pod or of itself) writes its status again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "kube/backoff.h"
#include "kube/claim_status_writer.h"

namespace vfio_dra::kube {

struct ClaimStatusQueueOptions {
  std::chrono::milliseconds first_retry{std::chrono::seconds(1)};
  std::chrono::milliseconds max_retry{std::chrono::minutes(5)};
  // Bounds one write (with the API client's own retries): Stop waits for a write in flight.
  std::chrono::milliseconds write_timeout{std::chrono::seconds(10)};
  std::optional<unsigned> jitter_seed;  // tests: a fixed back-off
};

struct ClaimStatusQueueStats {
  size_t pending = 0;     // claims whose status is not written yet
  uint64_t written = 0;   // writes that landed
  uint64_t failed = 0;    // attempts that failed and are retried
  uint64_t given_up = 0;  // writes ended without landing: claim gone, unwanted, refused for good
};

class ClaimStatusQueue {
 public:
  ClaimStatusQueue(ClaimStatusWriter& writer, Clock& clock, Logger log,
                   ClaimStatusQueueOptions options = {});
  ~ClaimStatusQueue();  // Stop()
  ClaimStatusQueue(const ClaimStatusQueue&) = delete;
  ClaimStatusQueue& operator=(const ClaimStatusQueue&) = delete;

  // Makes `devices` this driver's entries of the claim (empty: removes ours), in the background.
  // claim.resource_version is the reading the content was decided on (empty: read it first).
  // Conditions without a lastTransitionTime keep the time of the same condition (type and status)
  // in the write this one replaces, else get the time of this call. `wanted` (none: always) is
  // asked on the worker before each write: false drops the write. Ignored after Stop.
  void Submit(const ClaimStatusTarget& claim, std::vector<AllocatedDeviceStatus> devices,
              std::function<bool()> wanted = {});
  // Whether entries of this driver may be on the claim by this queue's doing: a write pending, in
  // flight, or landed with entries (and not cleared since).
  bool MayHaveWritten(const std::string& claim_uid) const;

  // Ends the worker after a write in flight, dropping (and logging) the writes still pending.
  void Stop();

  ClaimStatusQueueStats Stats() const;
  // Tests: waits until no write is due now or in flight (the rest wait for their retry time), or
  // `timeout` passes.
  bool WaitUntilSettled(std::chrono::milliseconds timeout);

 private:
  struct Pending {
    ClaimStatusTarget claim;
    std::vector<AllocatedDeviceStatus> devices;
    std::function<bool()> wanted;
    uint64_t version = 0;  // of the newest Submit: a write in flight of an older one is stale
    Clock::TimePoint due;
    Backoff backoff;
    bool in_flight = false;
    int failures = 0;  // since the last write that landed; > 0: "behind" was logged
  };

  // What one attempt did, and the claim as it last read it.
  struct Outcome {
    Status status = Status::Ok();
    ClaimStatusTarget claim;
    bool unwanted = false;  // the submitter no longer wants it: nothing was written
  };

  void Run();
  // Decides and writes (mu_ is not held): reads the claim when `claim` has no reading, and again
  // after a conflict or an unserved version, a few times.
  Outcome Attempt(ClaimStatusTarget claim, const std::vector<AllocatedDeviceStatus>& devices,
                  const std::function<bool()>& wanted);
  // Takes the outcome of the write of `version` for `uid`; mu_ is held.
  void Finish(const std::string& uid, uint64_t version, const Outcome& outcome);
  // The pending write due first that is not in flight, or null; mu_ is held.
  Pending* NextDue(std::string& uid);
  void EnsureWorker();  // mu_ is held

  ClaimStatusWriter& writer_;
  Clock& clock_;
  Logger log_;
  const ClaimStatusQueueOptions options_;

  mutable std::mutex mu_;
  std::condition_variable wake_;                     // a Submit, or Stop
  std::condition_variable settled_;                  // nothing due or in flight
  std::map<std::string, Pending> pending_;           // by claim UID
  std::map<std::string, std::string> with_entries_;  // UID -> apiVersion, of landed entries
  uint64_t next_version_ = 0;
  ClaimStatusQueueStats stats_;
  bool stopping_ = false;
  bool worker_running_ = false;
  std::thread worker_;
};

}  // namespace vfio_dra::kube
