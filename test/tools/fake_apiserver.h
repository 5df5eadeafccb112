// FakeApiServer: an in-process Kubernetes API server on loopback for tests, with the semantics
// the plugin relies on: discovery (/version, /apis, /apis/resource.k8s.io[/<v>]), GET/LIST/WATCH
// with field selectors, create (generateName), update with resourceVersion checks (409), delete
// with preconditions, Status bodies shaped like the real server's (404/405/409/410/422/429), bearer
// token checks (401), and only the resource.k8s.io versions it is told to serve (others get the
// real server's plain "404 page not found"). Faults can be injected per request. Tests can
// stand in for other writers (PutSlice stores a slice as is) and for other server behaviour
// (alter_stored_slice changes what a slice write stores).
//
// Pods can be read (GET /api/v1/namespaces/<ns>/pods/<name>). A claim's status.devices can be
// written by server-side apply (PATCH .../resourceclaims/<name>/status, Content-Type
// application/apply-patch+yaml with a JSON body) as the real server does it for a
// `+listType=map` list keyed by (driver, pool, device, shareID): each field manager owns the
// entries it applied; an apply replaces the set of entries its manager owns and leaves the others'
// (an entry another manager also owns stays until nobody owns it). Field ownership inside an entry
// is not tracked: whoever applies an entry last writes all of it (without force, changing an entry
// that another manager owns is a 409 conflict). The apply is validated as the server does:
// fieldManager is required (422), metadata.uid and metadata.resourceVersion are preconditions
// (409), every entry must be an allocated device of the claim, with at most 8 well-formed
// conditions, data a JSON object of at most 10 KiB and networkData within its limits (422).
//
// With an RBAC file (FakeApiServerOptions::rbac_file) every authenticated request is made by one
// user, rbac_user, and is authorized as the real RBAC authorizer would authorize it under the
// file's roles and bindings (fake_rbac.h); a denial is the real 403 Forbidden Status.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake_rbac.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace vfio_dra::testing {

struct FakeApiServerOptions {
  std::set<std::string> served_versions = {"v1", "v1beta2", "v1beta1"};
  std::string token;  // when set, requests must carry "Authorization: Bearer <token>"
  std::string minor_version = "35";
  // DRAPartitionableDevices on the server: when false, sharedCounters and consumesCounters are
  // silently dropped on create/update, as the real server does with the gate off.
  bool partitionable_devices = true;
  // When set, called with every ResourceSlice a create or update is about to store (in its v1
  // form, after admission) and may change it, as a server that normalises or drops fields under
  // some other feature gate would; the writer's answer and the watch show the changed slice.
  // Called with the server's lock held: it must not call the server.
  std::function<void(nlohmann::json& slice)> alter_stored_slice;
  // Connections served at once: cpp-httplib gives each kept-alive connection a thread of this
  // pool for as long as it stays open, and a connection beyond them waits for one to close.
  int threads = 64;
  // When set, called at the start of every request before the server's lock is taken; it may
  // block, to keep requests in flight (and their connections busy) until a test lets them go.
  std::function<void()> hold_request;
  // When set, called before each slice watch event is sent, without the server's lock; it may
  // block, to hold the watch behind the writes' answers as a lagging server's watch is.
  std::function<void()> hold_watch_event;
  // When both are set the server speaks HTTPS with this certificate.
  std::string tls_cert_file;
  std::string tls_key_file;
  // When set too, clients must present a certificate this CA signed.
  std::string tls_client_ca_file;
  // When set, requests are authorized by the ClusterRoles and Roles this manifest file binds to
  // `rbac_user` (ShippedRbacFile() is the plugin's own); Start() fails on a malformed file.
  std::string rbac_file;
  std::string rbac_user = kPluginServiceAccountUser;
};

// Random faults on every request, for soak tests. Each probability is drawn independently, in the
// order listed; the first that hits decides the answer. So that a short soak sees every kind, the
// first request a kind with a non-zero probability applies to always gets it.
struct FaultMix {
  double drop = 0;           // headers sent, then the connection closes mid-body
  double server_error = 0;   // 500 InternalError
  double throttle = 0;       // 429 TooManyRequests with Retry-After: 1
  double conflict = 0;       // 409 Conflict, on writes to resourceslices only
  double watch_expired = 0;  // a slice watch opens with an ERROR event carrying 410 Expired
  double slow = 0;           // answered normally after `delay`
  std::chrono::milliseconds delay{200};
  unsigned seed = 1;
};

struct InjectedFaults {
  int drop = 0, server_error = 0, throttle = 0, conflict = 0, watch_expired = 0, slow = 0;
  int Total() const { return drop + server_error + throttle + conflict + watch_expired + slow; }
};

struct RecordedRequest {
  std::string method;
  std::string path;
  std::string query;
  std::string user_agent;
  std::string authorization;
  int client_port = 0;  // the client's TCP port: one per connection
  int status = 0;
  bool injected = false;  // answered by a fault the test injected
};

class FakeApiServer {
 public:
  explicit FakeApiServer(FakeApiServerOptions options = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // Listens on 127.0.0.1:`port` (0: any free port). Returns false when the port is taken or the
  // RBAC file cannot be loaded (which it reports on stderr).
  bool Start(int port = 0);
  // Stops listening and ends open watches; the stored objects survive a Start() on the same port.
  void Stop();
  int port() const { return port_; }
  std::string url() const {
    return (options_.tls_cert_file.empty() ? "http://" : "https://") + std::string("127.0.0.1:") +
           std::to_string(port_);
  }
  // Writes a kubeconfig for this server into `dir` and returns its path.
  std::string WriteKubeconfig(const std::string& dir, const std::string& token_file = "") const;

  void SetToken(const std::string& token);

  // Objects are kept in their v1 form. A claim without metadata.uid gets a fresh one.
  // Putting a claim forgets who applied its status.devices entries.
  nlohmann::json PutClaim(nlohmann::json claim);
  void RemoveClaim(const std::string& namespace_, const std::string& name);
  // The stored claim in its v1 form (with metadata.managedFields for status applies), or null
  // when there is none.
  nlohmann::json Claim(const std::string& namespace_, const std::string& name) const;
  // Pods are kept as given (core/v1); a pod without metadata.uid gets a fresh one and one without
  // metadata.namespace goes to "default". Returns the stored pod.
  nlohmann::json PutPod(nlohmann::json pod);
  void RemovePod(const std::string& namespace_, const std::string& name);
  void PutNode(const std::string& name, const std::string& uid);
  std::vector<nlohmann::json> Slices() const;
  // Waits (on the store's change notifications) until `done(slices)` holds or `timeout` passes.
  bool WaitForSlices(const std::function<bool(const std::vector<nlohmann::json>&)>& done,
                     std::chrono::milliseconds timeout);
  bool RemoveSlice(const std::string& name);  // as another actor would (emits a watch event)
  // Removes a slice without a watch event, as a deletion a watch missed (or saw before an older
  // event of the same slice) leaves a client believing it still exists.
  bool RemoveSliceUnwatched(const std::string& name);
  // Stores `slice` (v1 form, with metadata.name) as another writer would, without admission, so
  // that it may hold what this plugin cannot read; an existing slice of that name is replaced and
  // keeps its uid. Emits the watch event and returns the stored slice.
  nlohmann::json PutSlice(nlohmann::json slice);

  // The next `count` requests (of any kind, or only those whose path starts with `path_prefix`)
  // get `status` with a Status body; 429 and 503 carry Retry-After when `retry_after` > 0.
  void FailNext(int count, int status, int retry_after = 0, const std::string& path_prefix = "");
  // Drops the faults FailNext injected that have not been used up: the server recovers.
  void ClearFaults();

  // Replaces the random fault mix (all zero: none).
  void SetFaultMix(const FaultMix& mix);
  InjectedFaults Injected() const;

  // Deletes every slice matching a field selector, as the kubelet does at startup.
  size_t DeleteSlicesWhere(const std::string& field_selector);

  std::vector<RecordedRequest> Requests() const;
  // Wait (on the server's change notifications: every answered request, every stored change)
  // until `done` holds for the recorded requests, or for the stored claim (null when there is
  // none), or `timeout` passes.
  bool WaitForRequests(const std::function<bool(const std::vector<RecordedRequest>&)>& done,
                       std::chrono::milliseconds timeout);
  bool WaitForClaim(const std::string& namespace_, const std::string& name,
                    const std::function<bool(const nlohmann::json&)>& done,
                    std::chrono::milliseconds timeout);
  // Counts POST/PUT/DELETE requests on resourceslices (the reconciler's writes).
  size_t SliceWrites() const;
  // Slice events (ADDED, MODIFIED, DELETED) the server has made since it started.
  size_t SliceEvents() const;
  size_t CountRequests(const std::string& method, const std::string& path_prefix) const;
  void ClearRequests();

 private:
  struct Event {
    long long rv;
    std::string type;
    nlohmann::json object;
  };
  struct Fault {
    int remaining;
    int status;
    int retry_after;
    std::string path_prefix;
  };

  void InstallRoutes();
  // Handlers for one kind of path; mu_ is held.
  void ServePod(const httplib::Request& req, httplib::Response& res, const std::string& namespace_,
                const std::string& name) const;
  void ServeClaimStatus(const httplib::Request& req, httplib::Response& res,
                        const std::string& version, const std::string& namespace_,
                        const std::string& name);
  // Merges an applied (already validated) status.devices list into `claim` for `manager`.
  void MergeAppliedDevices(nlohmann::json& claim, const std::string& manager,
                           const nlohmann::json& applied);
  // Drops gated fields and validates a ResourceSlice body; on failure answers 422 and false.
  bool Admit(nlohmann::json& body, httplib::Response& res) const;
  long long NextRv();
  // Deletes the slices a parsed field selector matches; mu_ must be held.
  template <typename Selector>
  size_t DeleteMatchingLocked(const Selector& selector);
  void Emit(const std::string& type, const nlohmann::json& object);

  FakeApiServerOptions options_;
  // Loaded by Start() from options_.rbac_file, before any handler runs; null: allow everything.
  std::unique_ptr<const RbacAuthorizer> rbac_;
  std::unique_ptr<httplib::Server> server_;
  int listen_fd_ = -1;  // the server's listening socket, captured to raise its backlog
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;
  long long rv_ = 100;
  long long next_uid_ = 1;
  std::map<std::string, nlohmann::json> claims_;  // "ns/name"
  std::map<std::string, nlohmann::json> slices_;  // name
  std::map<std::string, nlohmann::json> nodes_;   // name
  std::map<std::string, nlohmann::json> pods_;    // "ns/name"
  // Which status.devices entries (by key) each field manager applied: "ns/name" -> manager -> keys.
  std::map<std::string, std::map<std::string, std::set<std::string>>> device_owners_;
  std::deque<Event> slice_events_;
  size_t slice_events_made_ = 0;
  std::vector<Fault> faults_;
  FaultMix mix_;
  std::mt19937 random_{1};
  InjectedFaults injected_;
  std::vector<RecordedRequest> requests_;
};

}  // namespace vfio_dra::testing
