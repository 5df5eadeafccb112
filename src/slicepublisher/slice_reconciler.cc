#include "slicepublisher/slice_reconciler.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>

#include "base/shared_repack.h"
#include "base/thread_name.h"
#include "kube/backoff.h"
#include "slicepublisher/publishable_pool.h"

namespace vfio_dra::slicepublisher {
namespace {

using nlohmann::json;

bool HasCounters(const SliceContent& content) {
  if (!content.shared_counters.empty()) return true;
  for (const auto& d : content.devices) {
    if (!d.consumes_counters.empty()) return true;
  }
  return false;
}

bool HasTaints(const SliceContent& content) {
  return std::any_of(content.devices.begin(), content.devices.end(),
                     [](const SliceDevice& d) { return !d.taints.empty(); });
}

int64_t PoolInt(const json& pool, const char* key) {
  return pool.contains(key) && pool[key].is_number_integer() ? pool[key].get<int64_t>() : 0;
}

// A string field of `object`, empty when absent or not a string.
std::string StringField(const json& object, const char* key) {
  return object.is_object() && object.contains(key) && object[key].is_string()
             ? object[key].get<std::string>()
             : std::string();
}

std::string ObjectName(const json& object) {
  return object.is_object() && object.contains("metadata") ? StringField(object["metadata"], "name")
                                                           : std::string();
}

}  // namespace

SliceReconciler::CachedSlice SliceReconciler::CachedSlice::From(
    const json& object, const Result<SliceContent>& content) {
  static const json kNone = json::object();
  const json& meta = object.contains("metadata") ? object["metadata"] : kNone;
  const json& spec = object.contains("spec") ? object["spec"] : kNone;
  const json& pool = spec.is_object() && spec.contains("pool") ? spec["pool"] : kNone;
  CachedSlice slice;
  slice.uid = StringField(meta, "uid");
  slice.resource_version = StringField(meta, "resourceVersion");
  slice.pool_name = StringField(pool, "name");
  slice.pool_generation = pool.is_object() ? PoolInt(pool, "generation") : 0;
  slice.pool_slice_count = pool.is_object() ? PoolInt(pool, "resourceSliceCount") : 0;
  slice.unreadable = !content.ok();
  if (content.ok()) slice.digest = DigestOf(*content);
  return slice;
}

SliceReconciler::SliceReconciler(kube::ApiClient& api, ReconcilerOptions options, Logger log)
    : api_(api), options_(std::move(options)), log_(std::move(log)) {
  LoadMaxima();
}

void SliceReconciler::LoadMaxima() {
  if (options_.mdev_maxima_path.empty()) return;
  auto loaded = MdevTypeMaxima::Load(options_.mdev_maxima_path);
  if (loaded.ok()) {
    maxima_ = std::move(*loaded);
    return;
  }
  // A cache of what the kernel showed: start from the kernel alone, keep the bad copy for a look.
  const std::string aside = options_.mdev_maxima_path + ".bad";
  const bool moved = std::rename(options_.mdev_maxima_path.c_str(), aside.c_str()) == 0;
  log_.Warn(
      "ignoring the learned mdev type maxima; vGPU counters start from what the kernel "
      "shows now and may be too small until each parent has been seen without instances",
      {{"error", loaded.error().message}, {"kept_as", moved ? aside : "(left in place)"}});
}

SliceReconciler::~SliceReconciler() { Stop(); }

std::string SliceReconciler::SlicesPath() const {
  std::lock_guard<std::mutex> lock(mu_);
  return "/apis/resource.k8s.io/" + profile_.api_version + "/resourceslices";
}

std::string SliceReconciler::Selector() const {
  return kube::UrlEncode("spec.nodeName=" + options_.node_name + ",spec.driver=" + options_.driver);
}

void SliceReconciler::Start() {
  sync_thread_ = std::thread([this] {
    NameThisThread("slice-sync");
    SyncLoop();
  });
  watch_thread_ = std::thread([this] {
    NameThisThread("slice-watch");
    WatchLoop();
  });
}

void SliceReconciler::Stop() {
  stopping_ = true;
  stop_watch_.request_stop();
  wake_.notify_all();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (sync_thread_.joinable()) sync_thread_.join();
}

void SliceReconciler::MarkDirty() {
  std::lock_guard<std::mutex> lock(mu_);
  dirty_ = true;
  stats_.in_sync = false;
  wake_.notify_all();
}

void SliceReconciler::SetScan(const discovery::NodeScan& scan) {
  // Only what the builder reads is kept until the next scan (see BuilderInput).
  auto kept = std::make_shared<const discovery::NodeScan>(BuilderInput(scan));
  std::optional<MdevTypeMaxima> to_save;
  {
    std::lock_guard<std::mutex> lock(mu_);
    scan_ = std::move(kept);
    if (maxima_.Observe(scan_->inventory) && !options_.mdev_maxima_path.empty()) {
      to_save = maxima_;
    }
    dirty_ = true;
    stats_.in_sync = false;
    wake_.notify_all();
  }
  // Written outside the lock (an fsync must not stall syncs); only the watcher thread sets scans,
  // so saves cannot overtake each other.
  if (to_save) {
    if (Status s = to_save->Save(options_.mdev_maxima_path); !s.ok()) {
      log_.Warn(
          "cannot keep the learned mdev type maxima; a restart may publish smaller vGPU "
          "counters until each parent is seen without instances",
          {{"error", s.error().message}});
    }
  }
}

void SliceReconciler::Compact() { RepackShared(mu_, scan_); }

void SliceReconciler::Resync() { MarkDirty(); }

void SliceReconciler::HeldDevicesReleased() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!kept_for_held_ && !syncing_) return;
  }
  MarkDirty();
}

ReconcilerStats SliceReconciler::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReconcilerStats stats = stats_;
  stats.profile = profile_;
  stats.adopted_forms = adopted_.size();
  return stats;
}

bool SliceReconciler::WaitInSync(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  // SetScan, Resync and watch events clear in_sync when they mark the state dirty; only a
  // successful sync with nothing new pending sets it again.
  return synced_.wait_for(lock, timeout, [&] { return stats_.in_sync && !dirty_; });
}

bool SliceReconciler::WaitForWatchEvents(uint64_t count, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return synced_.wait_for(lock, timeout, [&] { return stats_.watch_events >= count; });
}

SliceReconciler::CachedSlice SliceReconciler::ToCached(const json& object,
                                                       const Result<SliceContent>& content) const {
  if (!content.ok()) {
    log_.Warn("unreadable ResourceSlice; it will be rewritten or deleted",
              {{"slice", ObjectName(object)}, {"error", content.error().message}});
  }
  return CachedSlice::From(object, content);
}

void SliceReconciler::Remember(const json& object) {
  if (!object.contains("metadata")) return;
  StoreInCache(ObjectName(object), ToCached(object, SliceContentFromJson(object)));
}

void SliceReconciler::RememberWritten(const SliceContent& sent, const Sha256& sent_digest,
                                      const json& stored) {
  const Result<SliceContent> content = SliceContentFromJson(stored);
  CachedSlice slice = ToCached(stored, content);
  if (content.ok() && slice.digest.content != sent_digest) {
    AdoptStored(ObjectName(stored), sent_digest, slice.digest.content,
                HasCounters(sent) && !HasCounters(*content),
                HasTaints(sent) && !HasTaints(*content));
  }
  if (!stored.contains("metadata")) return;
  const std::string name = ObjectName(stored);
  const std::string version = slice.resource_version;
  StoreInCache(name, std::move(slice));
  std::lock_guard<std::mutex> lock(mu_);
  own_versions_[name].push_back(version);
}

bool SliceReconciler::IsOwnEchoLocked(const std::string& type, const std::string& name,
                                      const std::string& uid, const std::string& resource_version) {
  if (!uid.empty() && own_deletes_.count(uid)) {
    if (type == "DELETED") own_deletes_.erase(uid);  // nothing of that object comes after it
    return true;
  }
  auto it = own_versions_.find(name);
  if (it == own_versions_.end() || resource_version.empty()) return false;
  std::deque<std::string>& versions = it->second;
  auto at = std::find(versions.begin(), versions.end(), resource_version);
  if (at == versions.end()) return false;
  // Events come in order: the echoes of the writes before this one will not come any more.
  versions.erase(versions.begin(), at + 1);
  if (versions.empty()) own_versions_.erase(it);
  return true;
}

void SliceReconciler::StoreInCache(const std::string& name, CachedSlice slice) {
  std::lock_guard<std::mutex> lock(mu_);
  cache_[name] = std::move(slice);
}

void SliceReconciler::Forget(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  cache_.erase(name);
}

Status SliceReconciler::EnsureProfile() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (profile_known_) return Status::Ok();
  }
  auto group = api_.Get("/apis/resource.k8s.io");
  if (!group.ok()) {
    return group.error().Wrap("cannot discover the resource.k8s.io API (is DRA enabled?)");
  }
  std::set<std::string> served;
  if ((*group).contains("versions") && (*group)["versions"].is_array()) {
    for (const json& v : (*group)["versions"]) served.insert(v.value("version", ""));
  }
  std::string chosen;
  for (const char* v : {"v1", "v1beta2", "v1beta1"}) {
    if (served.count(v)) {
      chosen = v;
      break;
    }
  }
  if (chosen.empty()) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "the API server serves no resource.k8s.io version this plugin supports "
                     "(v1, v1beta2, v1beta1)");
  }
  auto version = api_.Get("/version");
  if (!version.ok()) return version.error().Wrap("cannot read the API server version");
  std::string minor_text = (*version).value("minor", "");
  minor_text.erase(
      std::remove_if(minor_text.begin(), minor_text.end(),
                     [](char c) { return !std::isdigit(static_cast<unsigned char>(c)); }),
      minor_text.end());
  auto minor = ParseKubernetesMinor("1." + minor_text);
  if (!minor.ok()) return minor.error().Wrap("cannot read the API server version");
  std::lock_guard<std::mutex> lock(mu_);
  profile_.api_version = chosen;
  profile_.kubernetes_minor = *minor;
  profile_known_ = true;
  log_.Info(
      "API server profile",
      {{"api_version", "resource.k8s.io/" + chosen},
       {"kubernetes", "1." + std::to_string(*minor)},
       {"counter_layout", profile_.Layout() == CounterLayout::kOwnSlice        ? "own-slice"
                          : profile_.Layout() == CounterLayout::kInDeviceSlice ? "in-device-slice"
                                                                               : "none"}});
  return Status::Ok();
}

Status SliceReconciler::EnsureNodeUid() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!node_uid_.empty()) return Status::Ok();
  }
  auto node = api_.Get("/api/v1/nodes/" + kube::UrlEncode(options_.node_name));
  if (!node.ok()) {
    return node.error().Wrap("cannot read Node " + options_.node_name +
                             " (its UID owns the slices)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  node_uid_ = (*node)["metadata"].value("uid", "");
  return Status::Ok();
}

Status SliceReconciler::ListIntoCache(std::string& resource_version) {
  auto list = api_.Get(SlicesPath() + "?fieldSelector=" + Selector());
  if (!list.ok()) return list.error().Wrap("cannot list this node's ResourceSlices");
  std::map<std::string, CachedSlice> fresh;
  std::vector<SliceContent> readable;  // kept only until the first publish
  const bool keep_devices = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return !published_once_;
  }();
  if ((*list).contains("items") && (*list)["items"].is_array()) {
    for (const json& item : (*list)["items"]) {
      Result<SliceContent> content = SliceContentFromJson(item);
      fresh[ObjectName(item)] = ToCached(item, content);
      if (keep_devices && content.ok()) readable.push_back(std::move(*content));
    }
  }
  PublishedDevices::Snapshot listed;
  if (keep_devices) {
    std::vector<const SliceDevice*> devices;
    for (const SliceContent& slice : readable) {
      for (const SliceDevice& device : slice.devices) devices.push_back(&device);
    }
    listed.devices = std::make_shared<const PackedDeviceTable>(devices);
    listed.counter_sets =
        std::make_shared<const std::map<std::string, CounterSet>>(CounterSetsOf(readable));
  }
  resource_version = (*list)["metadata"].value("resourceVersion", "");
  std::lock_guard<std::mutex> lock(mu_);
  if (!published_once_) listed_before_publish_ = std::move(listed);
  cache_ = std::move(fresh);
  own_versions_.clear();
  own_deletes_.clear();
  cache_ready_ = true;
  dirty_ = true;
  wake_.notify_all();
  return Status::Ok();
}

void SliceReconciler::WatchLoop() {
  // Every node's plugin loses its watch when the API server restarts: full jitter spreads their
  // re-lists instead of sending them as one herd.
  kube::Backoff backoff(options_.initial_backoff, options_.max_backoff, kube::kFullJitter);
  auto pause = [&](std::chrono::milliseconds delay) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, delay, [&] { return stopping_.load(); });
  };
  bool lost_watch = false;
  while (!stopping_) {
    if (Status s = EnsureProfile(); !s.ok()) {
      log_.Warn("ResourceSlice watch waits for the API server", {{"error", s.error().message}});
      pause(backoff.Next());
      continue;
    }
    // A restarted server answers before it is ready (its authorizer refuses everything until
    // it has synced): every node's plugin would LIST into that, be refused, and LIST again.
    if (lost_watch) {
      if (Status s = ServerReady(); !s.ok()) {
        pause(backoff.Next());
        continue;
      }
      lost_watch = false;
    }
    std::string rv;
    if (Status s = ListIntoCache(rv); !s.ok()) {
      log_.Warn("ResourceSlice list failed", {{"error", s.error().message}});
      pause(backoff.Next());
      continue;
    }
    while (!stopping_) {
      const std::string path = SlicesPath() +
                               "?watch=1&allowWatchBookmarks=true&resourceVersion=" + rv +
                               "&timeoutSeconds=" + std::to_string(options_.watch_timeout.count()) +
                               "&fieldSelector=" + Selector();
      Status watched = api_.Watch(
          path,
          [&](const kube::WatchEvent& event) {
            const json& meta =
                event.object.contains("metadata") ? event.object["metadata"] : json::object();
            const std::string event_rv = meta.value("resourceVersion", "");
            if (!event_rv.empty()) rv = event_rv;
            if (event.type == "BOOKMARK") return true;
            const std::string name = meta.value("name", "");
            bool changed = false;
            {
              std::lock_guard<std::mutex> lock(mu_);
              auto it = cache_.find(name);
              if (IsOwnEchoLocked(event.type, name, meta.value("uid", ""), event_rv)) {
                changed = false;
              } else if (event.type == "DELETED") {
                changed = it != cache_.end();
              } else {
                changed = it == cache_.end() || it->second.resource_version != event_rv;
              }
            }
            if (changed && event.type == "DELETED") {
              Forget(name);
              log_.Info("ResourceSlice removed by someone else; re-creating", {{"slice", name}});
            } else if (changed) {
              Remember(event.object);
            }
            std::lock_guard<std::mutex> lock(mu_);
            if (changed) {
              dirty_ = true;
              stats_.in_sync = false;
              wake_.notify_all();
            }
            ++stats_.watch_events;  // after the dirty mark: a test waits on it, then on a sync
            synced_.notify_all();
            return true;
          },
          stop_watch_.get_token());
      if (stopping_) break;
      if (watched.ok()) {
        backoff.Reset();
        continue;  // the server ended the watch; resume from the last resourceVersion
      }
      if (watched.error().kind != ErrorKind::kGone) {
        log_.Warn("ResourceSlice watch failed", {{"error", watched.error().message}});
        lost_watch = true;
      }
      // A 410 too: a restarted server answers every node's resumed watch with it at once.
      pause(backoff.Next());
      break;  // relist
    }
  }
}

Status SliceReconciler::ServerReady() {
  auto response = api_.Call("GET", "/readyz");
  if (!response.ok()) return response.error();
  // 5xx: not ready yet. 401, 403 or 404 (a server that does not let everyone ask, as it does by
  // default) say nothing of readiness: the LIST goes ahead rather than waiting forever.
  if (response->status >= 500) {
    return MakeError(ErrorKind::kUnavailable, "the API server is not ready yet (/readyz: HTTP " +
                                                  std::to_string(response->status) + ")");
  }
  return Status::Ok();
}

void SliceReconciler::SyncLoop() {
  kube::Backoff backoff(options_.initial_backoff, options_.max_backoff);
  using SteadyClock = std::chrono::steady_clock;
  auto next_resync = SteadyClock::now() + options_.resync_interval;
  auto retry_at = SteadyClock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const auto ready = [&] {
      return stopping_ || (dirty_ && cache_ready_ && scan_ && SteadyClock::now() >= retry_at);
    };
    const auto deadline = dirty_ ? std::min(retry_at, next_resync) : next_resync;
    wake_.wait_until(lock, deadline, ready);
    if (stopping_) break;
    if (SteadyClock::now() >= next_resync && cache_ready_ && scan_) dirty_ = true;
    if (!ready() || !dirty_) continue;
    dirty_ = false;
    syncing_ = true;
    lock.unlock();
    Status status = Sync();
    lock.lock();
    syncing_ = false;
    ++stats_.syncs;
    if (!status.ok()) {
      ++stats_.failed_syncs;
      stats_.last_error = status.error().message;
      stats_.in_sync = false;
      dirty_ = true;
      const auto delay = backoff.Next();
      retry_at = SteadyClock::now() + delay;
      log_.Warn("ResourceSlice sync failed; retrying",
                {{"error", status.error().message}, {"retry_ms", std::to_string(delay.count())}});
    } else {
      backoff.Reset();
      stats_.last_error.clear();
      stats_.in_sync = !dirty_;
      next_resync = SteadyClock::now() + options_.resync_interval;
    }
    synced_.notify_all();
  }
}

Status SliceReconciler::Sync() {
  if (Status s = EnsureProfile(); !s.ok()) return s;
  if (Status s = EnsureNodeUid(); !s.ok()) return s;
  std::map<std::string, CachedSlice> cache;
  ServerProfile profile;
  SliceMeta meta;
  PublishablePool publishable;
  TaintInputs taints;
  taints.driver = options_.driver;
  taints.now = Rfc3339(options_.unix_now ? options_.unix_now()
                                         : std::chrono::duration_cast<std::chrono::seconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count());
  if (options_.held_devices) taints.held = options_.held_devices();
  if (options_.held_attributes) taints.recorded = options_.held_attributes();
  PublishedDevices::Snapshot standing;
  if (options_.published != nullptr) standing = options_.published->Current();
  std::shared_ptr<const PackedDeviceTable> published;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Before this process first publishes, what stands is what the server holds: an earlier
    // instance's taints keep their times instead of every restart resetting (and rewriting) them.
    if (!published_once_) standing = listed_before_publish_;
    published = standing.devices;
    taints.published = published.get();
    taints.published_sets = standing.counter_sets.get();
    cache = cache_;
    profile = profile_;
    meta.node_uid = node_uid_;
    publishable = BuildPublishablePool(*scan_, {options_.node_name, options_.driver, profile},
                                       maxima_, &taints);
    kept_for_held_ =
        std::any_of(publishable.pool.kept.begin(), publishable.pool.kept.end(),
                    [&](const std::string& name) { return taints.held.contains(name); });
  }
  // Logged when a device gains taints, not at every sync that keeps them.
  for (const auto& [device, reason] : publishable.pool.taint_reasons) {
    const std::optional<SliceDevice> before = published ? published->Find(device) : std::nullopt;
    if (!before || before->taints.empty()) {
      log_.Warn("device tainted", {{"device", device}, {"reason", reason}});
    }
  }
  const DesiredPool& pool = publishable.pool;
  for (const std::string& warning : pool.warnings) {
    log_.Warn("slice layout", {{"warning", warning}});
  }
  if (!publishable.valid.ok()) {
    return publishable.valid.error().Wrap("not publishing: the desired slices would be rejected");
  }
  if (options_.published != nullptr) options_.published->Set(pool);
  {
    std::lock_guard<std::mutex> lock(mu_);
    published_once_ = true;
    listed_before_publish_ = {};
  }

  const WritePlan plan = PlanWrites(pool, cache);
  ForgetAdoptionsOtherThan(plan.desired);
  if (plan.obsolete.empty() && plan.creates == 0 && plan.changed.empty()) return Status::Ok();
  meta.api_version = profile.api_version;
  meta.driver = options_.driver;
  meta.node_name = options_.node_name;
  meta.pool_name = pool.name;
  meta.generation = plan.generation;
  meta.slice_count = static_cast<int64_t>(pool.slices.size());
  const std::string path = "/apis/resource.k8s.io/" + profile.api_version + "/resourceslices";
  // Obsolete slices go first: stale devices disappear even if the rest fails.
  if (Status s = DeleteObsolete(plan, cache, path); !s.ok()) return s;
  if (Status s = UpdateChanged(pool, plan, cache, path, meta); !s.ok()) return s;
  if (Status s = CreateNew(pool, plan, path, meta); !s.ok()) return s;
  log_.Info("ResourceSlices published", {{"slices", std::to_string(pool.slices.size())},
                                         {"generation", std::to_string(plan.generation)},
                                         {"deleted", std::to_string(plan.obsolete.size())}});
  return Status::Ok();
}

SliceReconciler::WritePlan SliceReconciler::PlanWrites(
    const DesiredPool& pool, const std::map<std::string, CachedSlice>& cache) const {
  WritePlan plan;
  for (const auto& [name, slice] : cache) {
    plan.generation = std::max(plan.generation, slice.pool_generation);
  }
  plan.desired.reserve(pool.slices.size());
  for (const SliceContent& slice : pool.slices) plan.desired.push_back(DigestOf(slice));
  MatchSlices(cache, plan);
  const auto count = static_cast<int64_t>(pool.slices.size());
  for (size_t i = 0; i < pool.slices.size(); ++i) {
    if (plan.match[i].empty()) {
      ++plan.creates;
      continue;
    }
    const CachedSlice& current = cache.at(plan.match[i]);
    if (!HoldsContent(current, plan.desired[i].content) || current.pool_slice_count != count ||
        current.pool_name != pool.name || current.pool_generation != plan.generation) {
      plan.changed.push_back(i);
    }
  }
  if (plan.obsolete.empty() && plan.creates == 0 && plan.changed.empty()) return plan;
  // A change that touches more than one slice needs a new pool generation, so that a reader
  // never combines slices of two states; every kept slice is then rewritten with it.
  const bool bump =
      !plan.obsolete.empty() || plan.creates > 0 || plan.changed.size() > 1 || plan.generation == 0;
  if (bump) {
    ++plan.generation;
    plan.changed.clear();
    for (size_t i = 0; i < pool.slices.size(); ++i) {
      if (!plan.match[i].empty()) plan.changed.push_back(i);
    }
  }
  return plan;
}

// A lone desired slice rewrites a lone existing one whatever it offers; otherwise slices are
// matched by their device and counter-set names, which an unreadable slice does not offer.
void SliceReconciler::MatchSlices(const std::map<std::string, CachedSlice>& cache,
                                  WritePlan& plan) {
  plan.match.assign(plan.desired.size(), std::string());
  std::set<std::string> used;
  if (plan.desired.size() == 1 && cache.size() == 1) {
    plan.match[0] = cache.begin()->first;
    used.insert(plan.match[0]);
  } else {
    for (size_t i = 0; i < plan.desired.size(); ++i) {
      for (const auto& [name, slice] : cache) {
        if (!slice.unreadable && !used.count(name) && slice.digest.names == plan.desired[i].names) {
          plan.match[i] = name;
          used.insert(name);
          break;
        }
      }
    }
  }
  for (const auto& [name, slice] : cache) {
    if (!used.count(name)) plan.obsolete.push_back(name);
  }
}

bool SliceReconciler::HoldsContent(const CachedSlice& current, const Sha256& desired) const {
  if (current.unreadable) return false;
  if (current.digest.content == desired) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = adopted_.find(desired);
  return it != adopted_.end() && it->second == current.digest.content;
}

void SliceReconciler::ForgetAdoptionsOtherThan(const std::vector<SliceDigest>& desired) {
  std::set<Sha256> wanted;
  for (const SliceDigest& digest : desired) wanted.insert(digest.content);
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(adopted_, [&](const auto& entry) { return wanted.count(entry.first) == 0; });
}

// What the server stored differs from what we sent: counters dropped (gate off) or other fields
// dropped. Either way, adopt it instead of rewriting forever.
void SliceReconciler::AdoptStored(const std::string& name, const Sha256& sent, const Sha256& stored,
                                  bool counters_dropped, bool taints_dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  if (taints_dropped) {
    if (!profile_.taints_dropped) {
      profile_.taints_dropped = true;
      log_.Warn(
          "the API server dropped device taints (DRADeviceTaints is off): unhealthy devices are "
          "reported through the kubelet's health stream only, and the scheduler is not told");
    }
    dirty_ = true;
    return;
  }
  if (counters_dropped) {
    if (!profile_.counters_dropped) {
      profile_.counters_dropped = true;
      log_.Warn(
          "the API server dropped sharedCounters/consumesCounters (DRAPartitionableDevices "
          "is off): publishing whole devices and existing mdev instances only");
    }
    dirty_ = true;
    return;
  }
  if (!adopted_.count(sent)) {
    log_.Warn(
        "the API server stored a ResourceSlice differently from what was sent (a feature "
        "gate may be off); adopting the stored form",
        {{"slice", name}});
  }
  adopted_[sent] = stored;
}

Status SliceReconciler::DeleteObsolete(const WritePlan& plan,
                                       const std::map<std::string, CachedSlice>& cache,
                                       const std::string& path) {
  for (const std::string& name : plan.obsolete) {
    const CachedSlice& slice = cache.at(name);
    Status s = api_.Delete(path + "/" + name, slice.uid, slice.resource_version);
    if (!s.ok() && s.error().kind != ErrorKind::kNotFound) {
      return s.error().Wrap("cannot delete obsolete ResourceSlice " + name);
    }
    Forget(name);
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok() && !slice.uid.empty()) own_deletes_.insert(slice.uid);
    ++stats_.deletes;
  }
  return Status::Ok();
}

// Updates carry the resourceVersion we know; a conflict re-reads the object and retries.
Status SliceReconciler::UpdateChanged(const DesiredPool& pool, const WritePlan& plan,
                                      const std::map<std::string, CachedSlice>& cache,
                                      const std::string& path, SliceMeta meta) {
  for (size_t i : plan.changed) {
    meta.name = plan.match[i];
    meta.resource_version = cache.at(meta.name).resource_version;
    for (int attempt = 0;; ++attempt) {
      auto stored = api_.Update(path + "/" + meta.name, SliceToJson(pool.slices[i], meta));
      if (stored.ok()) {
        RememberWritten(pool.slices[i], plan.desired[i].content, *stored);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.updates;
        break;
      }
      const bool conflict = stored.error().kind == ErrorKind::kConflict;
      const bool gone = stored.error().kind == ErrorKind::kNotFound;
      if (!(conflict || gone) || attempt >= 3) {
        return stored.error().Wrap("cannot update ResourceSlice " + meta.name);
      }
      if (conflict) {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.conflicts;
      }
      // Either way the cache is wrong about this slice: re-read it. A 404 means it was deleted and
      // the watch has not said so (or said something older after it): forgotten, the next sync
      // creates it, instead of updating a slice that is gone for ever.
      auto fresh = api_.Get(path + "/" + meta.name);
      if (!fresh.ok() && fresh.error().kind == ErrorKind::kNotFound) {
        Forget(meta.name);
        return fresh.error().Wrap("ResourceSlice " + meta.name +
                                  " was deleted behind the watch; it is created again");
      }
      if (!fresh.ok()) return fresh.error().Wrap("cannot re-read ResourceSlice " + meta.name);
      Remember(*fresh);
      meta.resource_version = (*fresh)["metadata"].value("resourceVersion", "");
    }
  }
  return Status::Ok();
}

Status SliceReconciler::CreateNew(const DesiredPool& pool, const WritePlan& plan,
                                  const std::string& path, SliceMeta meta) {
  meta.name.clear();
  meta.resource_version.clear();
  for (size_t i = 0; i < pool.slices.size(); ++i) {
    if (!plan.match[i].empty()) continue;
    auto stored = api_.Create(path, SliceToJson(pool.slices[i], meta));
    if (!stored.ok()) {
      if (stored.error().kind == ErrorKind::kNotFound) {
        std::lock_guard<std::mutex> lock(mu_);
        profile_known_ = false;  // the served API version went away; rediscover
      }
      return stored.error().Wrap("cannot create a ResourceSlice");
    }
    RememberWritten(pool.slices[i], plan.desired[i].content, *stored);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.creates;
  }
  return Status::Ok();
}

}  // namespace vfio_dra::slicepublisher
