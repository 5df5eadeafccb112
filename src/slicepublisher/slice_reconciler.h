// SliceReconciler: keeps this node's ResourceSlices equal to the desired pool for the daemon's
// whole life. A watch on its own slices (field selectors spec.nodeName and spec.driver) keeps a
// cache; any change made by someone else (a kubelet wipe, a manual delete) schedules a sync at
// once. A sync deletes obsolete slices first (with uid/resourceVersion preconditions), then
// updates (with resourceVersion; a conflict re-reads and retries), then creates (generateName
// "<node>-<driver>-", owned by the Node), bumping the pool generation unless at most one slice
// changes. It adapts to the server: the newest served resource.k8s.io version, the counter
// layout of its release, and a counter-free layout when the server drops counter fields (the
// partitionable-devices gate is off), adopting whatever else the server stores so that no
// update loop can start. A slice whose content it cannot read is never taken as up to date: it is
// rewritten or deleted. Slices stay in place when the reconciler stops. Until it first
// publishes, what the server's slices hold stands for what was published (by an earlier
// instance): taints keep their times and devices prepared claims hold stay, across restarts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stop_token>
#include <thread>

#include "base/log.h"
#include "base/result.h"
#include "discovery/node_scan.h"
#include "kube/api_client.h"
#include "slicepublisher/published_devices.h"
#include "slicepublisher/server_profile.h"
#include "slicepublisher/slice_builder.h"
#include "slicepublisher/slice_digest.h"
#include "slicepublisher/slice_json.h"

namespace vfio_dra::slicepublisher {

struct ReconcilerOptions {
  std::string driver;
  std::string node_name;
  std::chrono::milliseconds resync_interval{std::chrono::minutes(10)};
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{std::chrono::seconds(10)};
  std::chrono::seconds watch_timeout{300};
  // Told every pool the reconciler sets out to publish (device preparation looks devices up
  // there); may be null.
  PublishedDevices* published = nullptr;
  // Where the learned mdev type maxima are kept across restarts (mdev_type_maxima.h); empty:
  // in memory only.
  std::string mdev_maxima_path;
  // Names of the devices prepared claims hold (a device that is gone stays published, tainted,
  // while one does: device_taints.h); null: none. Called without the reconciler's lock.
  std::function<std::set<std::string>()> held_devices;
  // What the checkpoint records of the devices prepared claims hold, by device name: one that is
  // gone with nothing standing to keep it from (a restart after the kubelet deleted the slices)
  // is published from it, tainted lost. Null: none. Called without the reconciler's lock.
  std::function<std::map<std::string, RecordedAttributes>()> held_attributes;
  // Seconds since the epoch, for the time of new taints; null: the system clock.
  std::function<int64_t()> unix_now;
};

struct ReconcilerStats {
  uint64_t syncs = 0;
  uint64_t failed_syncs = 0;
  uint64_t creates = 0;
  uint64_t updates = 0;
  uint64_t deletes = 0;
  uint64_t conflicts = 0;
  uint64_t watch_events = 0;  // taken from the watch (echoes of our own writes included)
  // Contents sent whose stored form (the server dropped a field) is taken as theirs: at most one
  // per desired slice, as adoptions of contents no longer desired are forgotten.
  size_t adopted_forms = 0;
  bool in_sync = false;  // the last sync succeeded and nothing changed since
  std::string last_error;
  ServerProfile profile;
};

class SliceReconciler {
 public:
  SliceReconciler(kube::ApiClient& api, ReconcilerOptions options, Logger log);
  ~SliceReconciler();
  SliceReconciler(const SliceReconciler&) = delete;
  SliceReconciler& operator=(const SliceReconciler&) = delete;

  void Start();
  void Stop();  // leaves the slices in place
  // A new view of the node; a sync follows.
  void SetScan(const discovery::NodeScan& scan);
  // Copies the kept part of the scan anew and drops the old copy, which SetScan made while the
  // whole scan was in the heap (see PublishedDevices::Compact). Nothing else changes.
  void Compact();
  // Asks for a full comparison now (also done every resync_interval).
  void Resync();
  // A prepared claim was unprepared, so held_devices may have lost devices. A sync follows only
  // when the last one kept a device because a claim held it, or one is under way (it may have
  // asked held_devices before the claim went): else what is published cannot change, and a sync
  // would rebuild the whole pool per claim for nothing.
  void HeldDevicesReleased();

  ReconcilerStats Stats() const;
  // Waits until everything the reconciler has been told so far (scans, resyncs, watch events)
  // has been synced successfully; true at once when nothing is pending. (Waiting for a sync that
  // starts after the call would miss one that finished just before it.)
  bool WaitInSync(std::chrono::milliseconds timeout);
  // Until the watch has taken `count` events in all (each acted on); false at the timeout.
  bool WaitForWatchEvents(uint64_t count, std::chrono::milliseconds timeout);

 private:
  // What a Sync needs of a server slice: its identity, its pool fields and digests of its
  // content. Neither the object nor its decoded content is kept: with 1,000 devices they cost
  // megabytes of the idle daemon's heap.
  struct CachedSlice {
    std::string uid;
    std::string resource_version;
    std::string pool_name;
    int64_t pool_generation = 0;
    int64_t pool_slice_count = 0;
    SliceDigest digest;
    // Its content could not be decoded, so what it offers is unknown: it matches no desired
    // slice by names and equals no desired content, and is rewritten or deleted.
    bool unreadable = false;

    // `content` is what the object decodes to; an error makes the slice unreadable.
    static CachedSlice From(const nlohmann::json& object, const Result<SliceContent>& content);
  };
  // What one Sync writes: desired slices matched to existing ones by device and counter-set names.
  struct WritePlan {
    std::vector<SliceDigest> desired;   // per desired slice: its digests, kept for the writes
    std::vector<std::string> match;     // per desired slice: the slice it rewrites, or "" (create)
    std::vector<std::string> obsolete;  // existing slices no desired slice matches
    std::vector<size_t> changed;        // desired slices whose match must be updated
    size_t creates = 0;
    int64_t generation = 0;  // the pool generation to write
  };
  void SyncLoop();
  void WatchLoop();
  // One pass: build and validate the desired pool, then delete, update and create slices.
  Status Sync();
  WritePlan PlanWrites(const DesiredPool& pool,
                       const std::map<std::string, CachedSlice>& cache) const;
  // Fills plan.match and plan.obsolete from plan.desired.
  static void MatchSlices(const std::map<std::string, CachedSlice>& cache, WritePlan& plan);
  // Whether `current` holds the desired content, as sent or as the server stored it before.
  bool HoldsContent(const CachedSlice& current, const Sha256& desired) const;
  // The server stored our slice `name` (sent with digest `sent`) as `stored`: remembers that, so
  // the stored form counts as written; or, when it dropped the counters, falls back to the
  // counter-free layout; when it dropped the taints, stops sending them.
  void AdoptStored(const std::string& name, const Sha256& sent, const Sha256& stored,
                   bool counters_dropped, bool taints_dropped);
  Status DeleteObsolete(const WritePlan& plan, const std::map<std::string, CachedSlice>& cache,
                        const std::string& path);
  Status UpdateChanged(const DesiredPool& pool, const WritePlan& plan,
                       const std::map<std::string, CachedSlice>& cache, const std::string& path,
                       SliceMeta meta);
  Status CreateNew(const DesiredPool& pool, const WritePlan& plan, const std::string& path,
                   SliceMeta meta);
  Status EnsureProfile();
  Status EnsureNodeUid();
  Status ListIntoCache(std::string& resource_version);
  // After a lost watch: Ok once /readyz answers 200, or answers what says nothing of readiness.
  Status ServerReady();
  void MarkDirty();
  std::string SlicesPath() const;
  std::string Selector() const;
  // The cache entry of a server object; an unreadable one is named in a warning.
  CachedSlice ToCached(const nlohmann::json& object, const Result<SliceContent>& content) const;
  // Drops the adoptions of contents that are not among `desired`: they can never match again,
  // and kept they would grow with every change of the node for as long as the daemon runs.
  void ForgetAdoptionsOtherThan(const std::vector<SliceDigest>& desired);
  // Applies a server response to the cache (so the watch echo of our own write is a no-op).
  void Remember(const nlohmann::json& object);
  // Remember for the server's answer to our write of `sent`: the answer is decoded and digested
  // once, for the cache and for adopting what the server made of it.
  void RememberWritten(const SliceContent& sent, const Sha256& sent_digest,
                       const nlohmann::json& stored);
  void StoreInCache(const std::string& name, CachedSlice slice);
  void Forget(const std::string& name);
  // Whether a watch event is the echo of a write of ours (possibly not the newest); mu_ held.
  bool IsOwnEchoLocked(const std::string& type, const std::string& name, const std::string& uid,
                       const std::string& resource_version);
  void LoadMaxima();

  kube::ApiClient& api_;
  ReconcilerOptions options_;
  Logger log_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable synced_;
  bool dirty_ = true;
  bool syncing_ = false;        // a Sync runs (outside mu_)
  bool kept_for_held_ = false;  // the last Sync's pool kept a device that a claim held
  std::shared_ptr<const discovery::NodeScan> scan_;
  std::map<std::string, CachedSlice> cache_;  // by slice name
  // Our writes whose watch events have not come yet: by slice name the resourceVersions in the
  // order written, and the UIDs of the slices we deleted. The watch can lag the writes' answers,
  // and the echo of an earlier write is old news, not someone else's change: taken as one, it put
  // a stale slice in the cache, which was then rewritten (a conflict and a second write each).
  // Cleared at each list, after which the watch starts anew.
  std::map<std::string, std::deque<std::string>> own_versions_;
  std::set<std::string> own_deletes_;
  bool cache_ready_ = false;
  ReconcilerStats stats_;
  MdevTypeMaxima maxima_;
  ServerProfile profile_;
  bool profile_known_ = false;
  std::string node_uid_;
  // What the server made of content we sent, so that stored-but-different content is not
  // rewritten forever: digest of the sent content -> digest of the stored content.
  std::map<Sha256, Sha256> adopted_;
  // The devices of the server's slices as listed before this process first published: what an
  // earlier instance published, so that a standing taint keeps its time (and a device a prepared
  // claim holds stays) across a restart. Dropped at the first publish.
  PublishedDevices::Snapshot listed_before_publish_;
  bool published_once_ = false;

  std::atomic<bool> stopping_{false};
  std::stop_source stop_watch_;  // wakes the watch's idle stream at Stop
  std::thread sync_thread_;
  std::thread watch_thread_;
};

}  // namespace vfio_dra::slicepublisher
