// The API client against the fake API server over real HTTP on loopback. The fake, not a real
// server: these tests inject what a real server cannot be made to do on demand (dropped
// connections and watches, 5xx and 429 with Retry-After, 410 on watch, slow answers, a rotated
// token, a given old server's discovery). What a real server decides is in test/cluster.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <set>
#include <sstream>
#include <stop_token>
#include <string_view>
#include <thread>

#include "cmd/serve_command.h"
#include "discovery/node_scan.h"
#include "fake_apiserver.h"
#include "kube/api_client.h"
#include "kube/claim_reader.h"
#include "kube/claim_status_queue.h"
#include "kube/claim_status_writer.h"
#include "kube/client_config.h"
#include "kube/httplib_transport.h"
#include "kube/pod.h"
#include "self_signed_certificate.h"
#include "slicepublisher/slice_reconciler.h"
#include "sysfs_fixture.h"
#include "unit/fake_clock.h"

namespace vfio_dra::kube {
namespace {

using nlohmann::json;
using testing::FakeApiServer;
using testing::FakeApiServerOptions;

json ClaimJson(const std::string& ns, const std::string& name, const std::string& uid) {
  return {{"metadata", {{"namespace", ns}, {"name", name}, {"uid", uid}}},
          {"spec", {{"devices", {{"requests", json::array()}}}}}};
}

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-kube-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    versions_.reset();
    client_.reset();
    transport_.reset();
    tokens_.reset();
    if (server_) server_->Stop();
    std::filesystem::remove_all(dir_);
  }
  void StartServer(FakeApiServerOptions options) {
    server_ = std::make_unique<FakeApiServer>(std::move(options));
    ASSERT_TRUE(server_->Start());
  }
  void Connect(const std::string& token_file = "", int max_retries = 3) {
    auto config = LoadKubeconfigFile(server_->WriteKubeconfig(dir_, token_file));
    ASSERT_TRUE(config.ok()) << config.error().message;
    auto transport = HttplibTransport::Create(*config, cmd::UserAgent());
    ASSERT_TRUE(transport.ok()) << transport.error().message;
    transport_ = std::move(*transport);
    tokens_ = std::make_unique<TokenSource>(config->token, config->token_file, RealClock());
    ApiClientOptions options;
    options.initial_backoff = std::chrono::milliseconds(5);
    options.max_backoff = std::chrono::milliseconds(20);
    options.max_retries = max_retries;
    options.qps = qps_;
    versions_.reset();
    client_ =
        std::make_unique<ApiClient>(*transport_, *tokens_, RealClock(), Logger::Discard(), options);
    versions_ = std::make_unique<ResourceApiVersions>(*client_);
  }

  std::string dir_;
  double qps_ = ApiClientOptions().qps;  // the client's own rate limit (0: none)
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<HttplibTransport> transport_;

  // A transport of its own to the started server, on `clock`; null, with the test failed, when
  // the kubeconfig or the transport cannot be made.
  std::unique_ptr<HttplibTransport> OwnTransport(const Clock& clock = RealClock()) {
    auto config = LoadKubeconfigFile(server_->WriteKubeconfig(dir_));
    if (!config.ok()) {
      ADD_FAILURE() << config.error().message;
      return nullptr;
    }
    auto transport = HttplibTransport::Create(*config, "test", clock);
    if (!transport.ok()) {
      ADD_FAILURE() << transport.error().message;
      return nullptr;
    }
    return std::move(*transport);
  }
  static HttpRequest VersionRequest() {
    HttpRequest get;
    get.path_and_query = "/version";
    return get;
  }
  // A self-signed certificate <name>.crt / <name>.key in dir_ with the given subjectAltName.
  ::testing::AssertionResult MakeCertificate(const std::string& name,
                                             const std::string& alt_names) {
    Status made = testing::MakeSelfSignedCertificate(dir_, name, alt_names);
    if (made.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << made.error().message;
  }
  static std::string Base64File(const std::string& path) {
    std::ifstream in(path);
    std::stringstream content;
    content << in.rdbuf();
    const std::string text = content.str();
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < text.size(); i += 3) {
      uint32_t chunk = static_cast<uint8_t>(text[i]) << 16;
      if (i + 1 < text.size()) chunk |= static_cast<uint8_t>(text[i + 1]) << 8;
      if (i + 2 < text.size()) chunk |= static_cast<uint8_t>(text[i + 2]);
      out += kAlphabet[(chunk >> 18) & 63];
      out += kAlphabet[(chunk >> 12) & 63];
      out += i + 1 < text.size() ? kAlphabet[(chunk >> 6) & 63] : '=';
      out += i + 2 < text.size() ? kAlphabet[chunk & 63] : '=';
    }
    return out;
  }
  // GET /version with a kubeconfig for the running server; `cluster_extra` goes under the
  // cluster, `user` is the user entry's flow map.
  Result<nlohmann::json> GetVersionWith(const std::string& cluster_extra,
                                        const std::string& user = "{}") {
    const std::string path = dir_ + "/tls-kubeconfig";
    std::ofstream(path, std::ios::trunc)
        << "current-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
        << "clusters:\n- name: k\n  cluster:\n    server: " << server_->url() << "\n"
        << cluster_extra << "users:\n- name: u\n  user: " << user << "\n";
    auto config = LoadKubeconfigFile(path);
    if (!config.ok()) return config.error();
    auto transport = HttplibTransport::Create(*config, "test");
    if (!transport.ok()) return transport.error();
    TokenSource tokens("", "", RealClock());
    ApiClientOptions api_options;
    api_options.max_retries = 0;
    ApiClient client(**transport, tokens, RealClock(), Logger::Discard(), api_options);
    return client.Get("/version");
  }
  std::unique_ptr<TokenSource> tokens_;
  std::unique_ptr<ApiClient> client_;
  std::unique_ptr<ResourceApiVersions> versions_;  // on client_, for claim readers and writers
};

TEST_F(KubeClientTest, ReadsClaimsFromTheNewestServedVersionAndRemembersIt) {
  FakeApiServerOptions options;
  options.served_versions = {"v1beta1"};  // a 1.32 cluster
  StartServer(options);
  Connect();
  server_->PutClaim(ClaimJson("vms", "c1", "u1"));
  server_->PutClaim(ClaimJson("vms", "c2", "u2"));
  ResourceClaimReader reader(*client_, *versions_);
  auto first = reader.Get("vms", "c1");
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->uid, "u1");
  EXPECT_EQ(first->api_version, "resource.k8s.io/v1beta1");
  EXPECT_EQ(reader.ServedVersion(), "v1beta1");
  // Discovery once, then the claim in the version it names: no probing of v1 and v1beta2.
  EXPECT_EQ(server_->CountRequests("GET", "/apis/resource.k8s.io/"), 1u);
  EXPECT_EQ(server_->CountRequests("GET", "/apis/resource.k8s.io"), 2u);
  server_->ClearRequests();
  ASSERT_TRUE(reader.Get("vms", "c2").ok());
  EXPECT_EQ(server_->CountRequests("GET", "/apis/resource.k8s.io"), 1u);
}

TEST_F(KubeClientTest, MissingClaimIsNotFoundNamingIt) {
  StartServer({});
  Connect();
  ResourceClaimReader reader(*client_, *versions_);
  auto missing = reader.Get("vms", "nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(missing.error().message.find("ResourceClaim vms/nope not found"), std::string::npos);
  EXPECT_EQ(reader.ServedVersion(), "v1");
}

TEST_F(KubeClientTest, NoResourceApiAtAllSaysSo) {
  FakeApiServerOptions options;
  options.served_versions = {};
  StartServer(options);
  Connect();
  ResourceClaimReader reader(*client_, *versions_);
  auto got = reader.Get("vms", "c");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message.find("serves none of resource.k8s.io"), std::string::npos);
}

TEST_F(KubeClientTest, SendsTheUserAgentAndBearerToken) {
  FakeApiServerOptions options;
  options.token = "sekret";
  StartServer(options);
  Connect();
  ASSERT_TRUE(client_->Get("/version").ok());
  const auto requests = server_->Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().authorization, "Bearer sekret");
  EXPECT_EQ(requests.back().user_agent.rfind("vfio-dra-plugin/", 0), 0u);
  EXPECT_NE(requests.back().user_agent.find("(linux/"), std::string::npos);
}

TEST_F(KubeClientTest, ReReadsARotatedTokenFileAfter401) {
  FakeApiServerOptions options;
  options.token = "first";
  StartServer(options);
  const std::string token_file = dir_ + "/token";
  std::ofstream(token_file) << "first\n";
  Connect(token_file);
  ASSERT_TRUE(client_->Get("/version").ok());
  // The kubelet rotates the projected token and the server stops accepting the old one.
  std::ofstream(token_file, std::ios::trunc) << "second\n";
  server_->SetToken("second");
  server_->ClearRequests();
  auto got = client_->Get("/version");
  ASSERT_TRUE(got.ok()) << got.error().message;
  const auto requests = server_->Requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].status, 401);
  EXPECT_EQ(requests[1].authorization, "Bearer second");
}

TEST_F(KubeClientTest, RetriesThrottlingAndServerErrors) {
  StartServer({});
  Connect();
  server_->FailNext(2, 429, 0, "/version");
  server_->FailNext(1, 503, 0, "/version");
  ASSERT_TRUE(client_->Get("/version").ok());
  EXPECT_EQ(server_->CountRequests("GET", "/version"), 4u);
}

TEST_F(KubeClientTest, ApiServerDownThenUp) {
  StartServer({});
  const int port = server_->port();
  Connect("", /*max_retries=*/1);
  server_->Stop();
  auto down = client_->Get("/version");
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().kind, ErrorKind::kUnavailable);
  EXPECT_NE(down.error().message.find("127.0.0.1"), std::string::npos);
  ASSERT_TRUE(server_->Start(port));
  EXPECT_TRUE(client_->Get("/version").ok());
}

TEST_F(KubeClientTest, WatchStreamsChangesWithFieldSelectors) {
  StartServer({});
  Connect();
  const std::string base = "/apis/resource.k8s.io/v1/resourceslices";
  auto list = client_->Get(base + "?fieldSelector=" + UrlEncode("spec.nodeName=n1"));
  ASSERT_TRUE(list.ok());
  const std::string rv = (*list)["metadata"]["resourceVersion"];

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> events;
  std::stop_source stop;
  Status watch_status;
  std::thread watcher([&] {
    watch_status = client_->Watch(
        base + "?watch=1&allowWatchBookmarks=true&resourceVersion=" + rv +
            "&fieldSelector=" + UrlEncode("spec.nodeName=n1,spec.driver=vfio.dra.io"),
        [&](const WatchEvent& e) {
          std::lock_guard<std::mutex> lock(mu);
          events.push_back(e.type + ":" + e.object["spec"].value("nodeName", ""));
          cv.notify_all();
          return true;
        },
        stop.get_token());
  });
  auto slice = [](const std::string& node) {
    return json{{"apiVersion", "resource.k8s.io/v1"},
                {"kind", "ResourceSlice"},
                {"metadata", {{"generateName", node + "-vfio.dra.io-"}}},
                {"spec",
                 {{"driver", "vfio.dra.io"},
                  {"nodeName", node},
                  {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}}}}};
  };
  // The watch may connect after these writes; it starts from `rv`, so it sees them either way.
  auto mine = client_->Create(base, slice("n1"));
  ASSERT_TRUE(mine.ok()) << mine.error().message;
  ASSERT_TRUE(client_->Create(base, slice("n2")).ok());
  const std::string name = (*mine)["metadata"]["name"];
  EXPECT_EQ(name.rfind("n1-vfio.dra.io-", 0), 0u);
  ASSERT_TRUE(client_
                  ->Delete(base + "/" + name, (*mine)["metadata"]["uid"],
                           (*mine)["metadata"]["resourceVersion"])
                  .ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return events.size() >= 2; }));
    EXPECT_EQ(events, (std::vector<std::string>{"ADDED:n1", "DELETED:n1"}));
  }
  // The stream is idle now: the stop must wake it (the transport does not poll for it).
  stop.request_stop();
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error().message;
}

TEST_F(KubeClientTest, StaleUpdateIsAConflictAndStaleDeleteToo) {
  StartServer({});
  Connect();
  const std::string base = "/apis/resource.k8s.io/v1/resourceslices";
  json slice = {{"metadata", {{"name", "s1"}}},
                {"spec",
                 {{"driver", "vfio.dra.io"},
                  {"nodeName", "n1"},
                  {"pool", {{"name", "n1"}, {"generation", 1}, {"resourceSliceCount", 1}}}}}};
  auto created = client_->Create(base, slice);
  ASSERT_TRUE(created.ok());
  json update = *created;
  update["spec"]["pool"]["generation"] = 2;
  ASSERT_TRUE(client_->Update(base + "/s1", update).ok());
  auto stale = client_->Update(base + "/s1", update);  // same, now outdated resourceVersion
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().kind, ErrorKind::kConflict);
  EXPECT_NE(stale.error().message.find("the object has been modified"), std::string::npos);
  Status stale_delete =
      client_->Delete(base + "/s1", "", (*created)["metadata"]["resourceVersion"]);
  ASSERT_FALSE(stale_delete.ok());
  EXPECT_EQ(stale_delete.error().kind, ErrorKind::kConflict);
}

TEST_F(KubeClientTest, PodReaderGetsPodsAndReportsMissingOnes) {
  StartServer({});
  Connect();
  server_->PutPod(
      {{"metadata",
        {{"namespace", "vms"},
         {"name", "virt-launcher-vm1"},
         {"annotations", {{"kubevirt.io/dra-networks", "[]"}}}}},
       {"spec", {{"resourceClaims", {{{"name", "nic"}, {"resourceClaimName", "c"}}}}}}});
  ApiPodReader reader(*client_);
  auto pod = reader.Get("vms", "virt-launcher-vm1", Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_EQ(pod->annotations.at("kubevirt.io/dra-networks"), "[]");
  EXPECT_EQ(pod->uid.rfind("pod-uid-", 0), 0u);
  EXPECT_EQ(pod->PodClaimNameOf("c"), "nic");

  auto missing = reader.Get("vms", "gone", Deadline());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(missing.error().message.find("Pod vms/gone not found (pods \"gone\" not found)"),
            std::string::npos)
      << missing.error().message;
  EXPECT_EQ(server_->CountRequests("GET", "/api/v1/namespaces/vms/pods/"), 2u);

  const json object = {{"metadata", {{"name", "virt-launcher-vm1"}}}};
  auto put = client_->Call("PUT", "/api/v1/namespaces/vms/pods/virt-launcher-vm1", &object);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->status, 405);
  EXPECT_EQ(put->body["reason"], "MethodNotAllowed");
}

// Claim status: a claim allocated three devices, two of ours and one of another driver.
class ClaimStatusTest : public KubeClientTest {
 protected:
  static constexpr const char* kStatusPath =
      "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/nic-claim/status";

  void SetUp() override {
    KubeClientTest::SetUp();
    StartWithClaim({});
  }

  void StartWithClaim(FakeApiServerOptions options) {
    StartServer(std::move(options));
    Connect();
    json claim = ClaimJson("vms", "nic-claim", "claim-uid-1");
    claim["status"]["allocation"] = {
        {"devices",
         {{"results",
           {Allocated("nic", "vfio.dra.io", "vf-a"), Allocated("nic2", "vfio.dra.io", "vf-b"),
            Allocated("net", "sriov.example.com", "eth1")}}}}};
    server_->PutClaim(claim);
    writer_ = std::make_unique<ApiClaimStatusWriter>(*client_, *versions_, "vfio.dra.io");
  }

  static json Allocated(const std::string& request, const std::string& driver,
                        const std::string& device) {
    return {{"request", request}, {"driver", driver}, {"pool", "node1"}, {"device", device}};
  }

  static AllocatedDeviceStatus Ours(const std::string& device, const std::string& mac) {
    AllocatedDeviceStatus status;
    status.driver = "vfio.dra.io";
    status.pool = "node1";
    status.device = device;
    status.conditions.push_back({"Ready", "True", "VfConfigured", "", 1, ""});
    status.network_data = NetworkDeviceData{"", {}, mac};
    return status;
  }

  Status Apply(const std::vector<AllocatedDeviceStatus>& devices,
               const std::string& uid = "claim-uid-1") {
    return writer_->Apply({"resource.k8s.io/v1", "vms", "nic-claim", uid, ""}, devices,
                          Deadline::After(std::chrono::seconds(10)));
  }

  // An apply as another client would send it.
  ApiResponse RawApply(const std::string& query, const json& devices,
                       const char* content_type = kApplyPatchContentType) {
    const json body = {{"apiVersion", "resource.k8s.io/v1"},
                       {"kind", "ResourceClaim"},
                       {"metadata", {{"name", "nic-claim"}, {"namespace", "vms"}}},
                       {"status", {{"devices", devices}}}};
    auto response =
        client_->Call("PATCH", std::string(kStatusPath) + query, &body, Deadline(), content_type);
    EXPECT_TRUE(response.ok());
    return response.ok() ? *response : ApiResponse{};
  }

  // "driver/device=hardwareAddress" of every stored status.devices entry, in order.
  std::vector<std::string> StoredDevices() const {
    std::vector<std::string> out;
    const json claim = server_->Claim("vms", "nic-claim");
    for (const json& entry : claim["status"].value("devices", json::array())) {
      std::string mac;
      if (entry.contains("networkData")) mac = entry["networkData"].value("hardwareAddress", "");
      out.push_back(entry["driver"].get<std::string>() + "/" + entry["device"].get<std::string>() +
                    "=" + mac);
    }
    return out;
  }

  // A queue as one plugin instance has it, over `writer` (its retries wait on queue_clock_).
  std::unique_ptr<ClaimStatusQueue> NewQueue(ClaimStatusWriter& writer) {
    ClaimStatusQueueOptions options;
    options.jitter_seed = 1;
    return std::make_unique<ClaimStatusQueue>(writer, queue_clock_, Logger::Discard(), options);
  }
  static void Settle(ClaimStatusQueue& queue) {
    ASSERT_TRUE(queue.WaitUntilSettled(std::chrono::seconds(60)));
  }

  testing::FakeClock queue_clock_;
  std::unique_ptr<ApiClaimStatusWriter> writer_;
};

TEST_F(ClaimStatusTest, ApplyAddsOurEntries) {
  Status status = Apply({Ours("vf-a", "de:ad:00:00:be:ef")});
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=de:ad:00:00:be:ef"});
  const json claim = server_->Claim("vms", "nic-claim");
  const json& entry = claim["status"]["devices"][0];
  EXPECT_EQ(entry["conditions"][0]["type"], "Ready");
  EXPECT_FALSE(entry["conditions"][0]["lastTransitionTime"].get<std::string>().empty());
  ASSERT_EQ(claim["metadata"]["managedFields"].size(), 1u);
  EXPECT_EQ(claim["metadata"]["managedFields"][0]["manager"], "vfio.dra.io");
  EXPECT_EQ(claim["metadata"]["managedFields"][0]["subresource"], "status");
  const auto requests = server_->Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().method, "PATCH");
  EXPECT_EQ(requests.back().path, kStatusPath);
  EXPECT_EQ(requests.back().query, "fieldManager=vfio.dra.io&force=true");
  EXPECT_EQ(requests.back().status, 200);
}

TEST_F(ClaimStatusTest, ApplyReplacesOnlyOurEntries) {
  // Another driver's entry, applied by its own manager, and one that predates any apply.
  ApiResponse theirs = RawApply("?fieldManager=sriov.example.com&force=true",
                                json::array({{{"driver", "sriov.example.com"},
                                              {"pool", "node1"},
                                              {"device", "eth1"},
                                              {"networkData", {{"interfaceName", "net1"}}}}}));
  ASSERT_EQ(theirs.status, 200) << theirs.raw_body;
  ASSERT_TRUE(Apply({Ours("vf-a", "02:00:00:00:00:0a"), Ours("vf-b", "02:00:00:00:00:0b")}).ok());
  EXPECT_EQ(StoredDevices(), (std::vector<std::string>{
                                 "sriov.example.com/eth1=", "vfio.dra.io/vf-a=02:00:00:00:00:0a",
                                 "vfio.dra.io/vf-b=02:00:00:00:00:0b"}));
  // The second apply lists vf-b only, with a new MAC: vf-a goes, theirs stays.
  ASSERT_TRUE(Apply({Ours("vf-b", "02:00:00:00:00:bb")}).ok());
  EXPECT_EQ(StoredDevices(), (std::vector<std::string>{"sriov.example.com/eth1=",
                                                       "vfio.dra.io/vf-b=02:00:00:00:00:bb"}));
  // An empty apply removes all of ours.
  ASSERT_TRUE(Apply({}).ok());
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"sriov.example.com/eth1="});
  const json managed = server_->Claim("vms", "nic-claim")["metadata"]["managedFields"];
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0]["manager"], "sriov.example.com");
}

TEST_F(ClaimStatusTest, EntriesNobodyAppliedSurviveOurApplies) {
  json claim = server_->Claim("vms", "nic-claim");
  claim["status"]["devices"] = {
      {{"driver", "sriov.example.com"}, {"pool", "node1"}, {"device", "eth1"}}};
  server_->PutClaim(claim);
  ASSERT_TRUE(Apply({Ours("vf-a", "02:00:00:00:00:0a")}).ok());
  ASSERT_TRUE(Apply({}).ok());
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"sriov.example.com/eth1="});
}

TEST_F(ClaimStatusTest, ReplacedOrDeletedClaimIsNotFound) {
  ASSERT_TRUE(Apply({Ours("vf-a", "02:00:00:00:00:0a")}).ok());
  Status replaced = Apply({Ours("vf-a", "02:00:00:00:00:ff")}, "claim-uid-0");
  ASSERT_FALSE(replaced.ok());
  EXPECT_EQ(replaced.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(replaced.error().message.find("was replaced"), std::string::npos);
  EXPECT_NE(replaced.error().message.find("Precondition failed: UID in precondition"),
            std::string::npos)
      << replaced.error().message;
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=02:00:00:00:00:0a"});

  server_->RemoveClaim("vms", "nic-claim");
  Status gone = Apply({Ours("vf-a", "02:00:00:00:00:0a")});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(gone.error().message.find("resourceclaims.resource.k8s.io \"nic-claim\" not found"),
            std::string::npos)
      << gone.error().message;
}

TEST_F(ClaimStatusTest, ForbiddenCarriesTheServersMessageAndTheRbacHint) {
  server_->FailNext(1, 403, 0, kStatusPath);
  Status forbidden = Apply({Ours("vf-a", "02:00:00:00:00:0a")});
  ASSERT_FALSE(forbidden.ok());
  EXPECT_EQ(forbidden.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(forbidden.error().message.find("HTTP 403 Forbidden: injected fault"), std::string::npos)
      << forbidden.error().message;
  EXPECT_NE(forbidden.error().message.find("deploy/daemonset/rbac.yaml"), std::string::npos);
  EXPECT_TRUE(StoredDevices().empty());
}

TEST_F(ClaimStatusTest, TheServerValidatesWhatIsApplied) {
  // A device the claim was not allocated.
  Status unallocated = Apply({Ours("vf-z", "02:00:00:00:00:0a")});
  ASSERT_FALSE(unallocated.ok());
  EXPECT_EQ(unallocated.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(unallocated.error().message.find(
                "status.devices[0]: Invalid value: \"vfio.dra.io/node1/vf-z\": must be an "
                "allocated device in the claim"),
            std::string::npos)
      << unallocated.error().message;

  const json vf_a = {{"driver", "vfio.dra.io"}, {"pool", "node1"}, {"device", "vf-a"}};
  json too_many = vf_a;
  for (int i = 0; i < 9; ++i) {
    too_many["conditions"].push_back({{"type", "C" + std::to_string(i)},
                                      {"status", "True"},
                                      {"reason", "R"},
                                      {"message", ""},
                                      {"lastTransitionTime", "2026-11-25T10:00:00Z"}});
  }
  ApiResponse response = RawApply("?fieldManager=m", json::array({too_many}));
  EXPECT_EQ(response.status, 422);
  EXPECT_NE(response.body.value("message", "").find("Too many: 9: must have at most 8 items"),
            std::string::npos);
  json long_mac = vf_a;
  long_mac["networkData"] = {{"hardwareAddress", std::string(129, 'a')}};
  response = RawApply("?fieldManager=m", json::array({long_mac}));
  EXPECT_EQ(response.status, 422);
  EXPECT_NE(response.body.value("message", "").find("hardwareAddress: Too long"),
            std::string::npos);
  json bad_type = vf_a;
  bad_type["conditions"] = "Ready";
  EXPECT_EQ(RawApply("?fieldManager=m", json::array({bad_type})).status, 400);

  response = RawApply("", json::array({vf_a}));
  EXPECT_EQ(response.status, 422);
  EXPECT_NE(response.body.value("message", "").find("fieldManager: Required value"),
            std::string::npos);
  EXPECT_EQ(RawApply("?fieldManager=m", json::array({vf_a}), "application/merge-patch+json").status,
            415);
  EXPECT_EQ(
      RawApply("?fieldManager=m&force=true", json::array({vf_a}), "application/merge-patch+json")
          .status,
      422);
  EXPECT_TRUE(StoredDevices().empty());
}

TEST_F(ClaimStatusTest, AnUnforcedApplyConflictsWithTheOwner) {
  ASSERT_TRUE(Apply({Ours("vf-a", "02:00:00:00:00:0a")}).ok());
  json changed = {{"driver", "vfio.dra.io"}, {"pool", "node1"}, {"device", "vf-a"}};
  ApiResponse response = RawApply("?fieldManager=intruder", json::array({changed}));
  EXPECT_EQ(response.status, 409);
  EXPECT_NE(response.body.value("message", "").find("conflict with \"vfio.dra.io\""),
            std::string::npos)
      << response.raw_body;
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=02:00:00:00:00:0a"});
}

TEST_F(ClaimStatusTest, WritesInTheVersionTheClaimWasReadIn) {
  FakeApiServerOptions options;
  options.served_versions = {"v1beta1"};
  server_->Stop();
  StartServer(options);
  Connect();
  writer_ = std::make_unique<ApiClaimStatusWriter>(*client_, *versions_, "vfio.dra.io");
  json claim = ClaimJson("vms", "old", "u-old");
  claim["status"]["allocation"] = {
      {"devices", {{"results", {Allocated("nic", "vfio.dra.io", "vf-a")}}}}};
  server_->PutClaim(claim);
  ResourceClaimReader reader(*client_, *versions_);
  auto read = reader.Get("vms", "old");
  ASSERT_TRUE(read.ok()) << read.error().message;
  Status status = writer_->Apply({read->api_version, read->namespace_, read->name, read->uid, ""},
                                 {Ours("vf-a", "02:00:00:00:00:0a")}, Deadline());
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ(server_->CountRequests("PATCH",
                                   "/apis/resource.k8s.io/v1beta1/namespaces/vms/resourceclaims/"
                                   "old/status"),
            1u);
  EXPECT_EQ(server_->Claim("vms", "old")["status"]["devices"].size(), 1u);
}

// A 1.32/1.33 server serves claims in v1beta1/v1beta2 only. The instance after a restart (or the
// next one of a rolling update) clears what the one before wrote: its clearing knows no API
// version and writes in the one the server serves, instead of ending at a 404 for
// resource.k8s.io/v1 with the entries left behind.
TEST_F(ClaimStatusTest, AClearingAfterARestartWritesInAVersionTheServerServes) {
  FakeApiServerOptions options;
  options.served_versions = {"v1beta1", "v1beta2"};
  server_->Stop();
  StartWithClaim(options);
  {
    auto before = NewQueue(*writer_);
    before->Submit({"resource.k8s.io/v1beta2", "vms", "nic-claim", "claim-uid-1", ""},
                   {Ours("vf-a", "02:00:00:00:00:0a")});
    Settle(*before);
    ASSERT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=02:00:00:00:00:0a"});
  }
  ApiClaimStatusWriter restarted(*client_, *versions_, "vfio.dra.io");
  auto after = NewQueue(restarted);
  after->Submit({"", "vms", "nic-claim", "claim-uid-1", ""}, {});
  Settle(*after);
  EXPECT_TRUE(StoredDevices().empty());
  EXPECT_EQ(after->Stats().given_up, 0u);
  EXPECT_EQ(after->Stats().pending, 0u);
}

// A 1.38 server serves resource.k8s.io/v1 only (v1beta1 claims are removed, v1beta2 goes in
// 1.39). A claim prepared before the cluster's upgrade is recorded in v1beta1; its status is
// written, read back and cleared in v1, and no request names a version the server does not serve.
// The fake stands in for the server here because it can serve exactly v1 with a 1.38 version.
TEST_F(ClaimStatusTest, AClaimRecordedInV1beta1IsWrittenInV1OnAServerServingOnlyV1) {
  FakeApiServerOptions options;
  options.served_versions = {"v1"};
  options.minor_version = "38";
  server_->Stop();
  StartWithClaim(options);
  server_->ClearRequests();
  auto queue = NewQueue(*writer_);
  queue->Submit({"resource.k8s.io/v1beta1", "vms", "nic-claim", "claim-uid-1", ""},
                {Ours("vf-a", "02:00:00:00:00:0a")});
  Settle(*queue);
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=02:00:00:00:00:0a"});
  auto reading =
      writer_->Read({"resource.k8s.io/v1beta1", "vms", "nic-claim", "claim-uid-1", ""}, Deadline());
  ASSERT_TRUE(reading.ok()) << reading.error().message;
  EXPECT_EQ(reading->api_version, "resource.k8s.io/v1");
  queue->Submit({"resource.k8s.io/v1beta1", "vms", "nic-claim", "claim-uid-1", ""}, {});
  Settle(*queue);
  EXPECT_TRUE(StoredDevices().empty());
  EXPECT_EQ(queue->Stats().given_up, 0u);
  ResourceClaimReader reader(*client_, *versions_);
  ASSERT_TRUE(reader.Get("vms", "nic-claim").ok());
  for (const testing::RecordedRequest& request : server_->Requests()) {
    EXPECT_EQ(request.path.find("/v1beta"), std::string::npos)
        << request.method << " " << request.path;
  }
}

// A rolling update: the older instance decides a prepare's status on the claim as it read it;
// before its write lands, the newer instance unprepares the claim and clears our entries. The
// older write's precondition (the claim as read) fails; it reads the claim again, asks again,
// finds the claim unprepared, and writes nothing: the cleared status stays cleared.
TEST_F(ClaimStatusTest, AnOlderInstancesWriteNeverResurrectsAClearedStatus) {
  auto older = NewQueue(*writer_);
  ApiClaimStatusWriter newer_writer(*client_, *versions_, "vfio.dra.io");
  auto newer = NewQueue(newer_writer);
  std::atomic<bool> prepared = true;  // the claim's record, in the checkpoint both instances share
  older->Submit({"resource.k8s.io/v1", "vms", "nic-claim", "claim-uid-1", ""},
                {Ours("vf-a", "02:00:00:00:00:0a")}, [&] { return prepared.load(); });
  Settle(*older);
  ASSERT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=02:00:00:00:00:0a"});

  // The kubelet's retry of the prepare reaches the older instance, which reads the claim...
  const std::string read_at =
      server_->Claim("vms", "nic-claim")["metadata"]["resourceVersion"].get<std::string>();
  std::atomic<int> asked = 0;
  older->Submit({"resource.k8s.io/v1", "vms", "nic-claim", "claim-uid-1", read_at},
                {Ours("vf-a", "02:00:00:00:00:aa")}, [&] {
                  if (asked++ > 0) return prepared.load();
                  // ...and, between its last look at the checkpoint and its write, the newer
                  // instance unprepares the claim and clears its status.
                  prepared = false;
                  newer->Submit({"", "vms", "nic-claim", "claim-uid-1", ""}, {},
                                [&] { return !prepared.load(); });
                  EXPECT_TRUE(newer->WaitUntilSettled(std::chrono::seconds(60)));
                  EXPECT_TRUE(StoredDevices().empty());
                  return true;
                });
  Settle(*older);
  EXPECT_TRUE(StoredDevices().empty());
  EXPECT_EQ(asked.load(), 2);
  EXPECT_EQ(older->Stats().given_up, 1u);
  size_t conflicts = 0;
  for (const testing::RecordedRequest& request : server_->Requests()) {
    if (request.method == "PATCH" && request.status == 409) ++conflicts;
  }
  EXPECT_EQ(conflicts, 1u);
}

// RBAC: the fake API server authorizes every request as a cluster does under the plugin's
// shipped deploy/daemonset/rbac.yaml (or a changed copy of it), as the plugin's service account.
class RbacTest : public ClaimStatusTest {
 protected:
  static constexpr const char* kPod = "virt-launcher-vm1";
  static constexpr const char* kForbiddenUser =
      "User \"system:serviceaccount:vfio-dra:vfio-dra-plugin\" cannot ";

  void SetUp() override {
    qps_ = 0;  // these tests make more calls than the client's rate limit lets burst
    ClaimStatusTest::SetUp();
  }

  // Replaces the server with one under `rbac_file` (as `user`, when given), holding the claim,
  // its pod and the node. The old server's connections go first, so that its stop need not wait
  // for them to idle out.
  void StartUnder(const std::string& rbac_file, const std::string& user = "") {
    writer_.reset();
    client_.reset();
    transport_.reset();
    tokens_.reset();
    server_->Stop();
    FakeApiServerOptions options;
    options.rbac_file = rbac_file;
    if (!user.empty()) options.rbac_user = user;
    StartWithClaim(options);
    server_->PutPod({{"metadata", {{"namespace", "vms"}, {"name", kPod}}}});
    server_->PutNode("node-1", "node-uid-1");
  }

  // Writes the shipped rbac.yaml, with `edit` applied to each of its documents, into the test's
  // directory; returns the copy's path.
  std::string ShippedRbacEdited(const std::string& copy_name,
                                const std::function<void(YAML::Node&)>& edit) {
    std::vector<YAML::Node> documents = YAML::LoadAllFromFile(testing::ShippedRbacFile());
    std::string path = dir_ + "/" + copy_name;
    std::ofstream out(path);
    for (YAML::Node& document : documents) {
      edit(document);
      out << "---\n" << YAML::Dump(document) << "\n";
    }
    return path;
  }

  // The shipped rbac.yaml without its ClusterRole rule for `resource` (which must be there, so
  // that a change to the shipped file cannot make the test pass without removing anything).
  std::string ShippedRbacWithout(const std::string& resource) {
    int removed = 0;
    std::string name = resource;
    std::replace(name.begin(), name.end(), '/', '-');
    std::string path = ShippedRbacEdited("rbac-without-" + name + ".yaml", [&](YAML::Node& doc) {
      if (doc["kind"].as<std::string>("") != "ClusterRole") return;
      YAML::Node kept(YAML::NodeType::Sequence);
      for (const YAML::Node& rule : doc["rules"]) {
        const YAML::Node resources = rule["resources"];
        const bool match =
            std::any_of(resources.begin(), resources.end(),
                        [&](const YAML::Node& r) { return r.as<std::string>() == resource; });
        if (match) {
          ++removed;
        } else {
          kept.push_back(rule);
        }
      }
      doc["rules"] = kept;
    });
    EXPECT_EQ(removed, 1) << "the shipped rbac.yaml should have one rule for " << resource;
    return path;
  }

  size_t Forbidden() const {
    size_t n = 0;
    for (const auto& r : server_->Requests()) n += r.status == 403 ? 1 : 0;
    return n;
  }
};

TEST_F(RbacTest, TheShippedRbacAllowsEverythingThePluginAsks) {
  StartUnder(testing::ShippedRbacFile());
  // Preparing a VF: the claim, the pod it is reserved for, the MAC in the claim's status.
  ResourceClaimReader claims(*client_, *versions_);
  auto claim = claims.Get("vms", "nic-claim");
  ASSERT_TRUE(claim.ok()) << claim.error().message;
  ApiPodReader pods(*client_);
  auto pod = pods.Get("vms", kPod, Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  Status applied = Apply({Ours("vf-a", "02:00:00:00:00:0a")});
  ASSERT_TRUE(applied.ok()) << applied.error().message;
  EXPECT_EQ(StoredDevices(), std::vector<std::string>{"vfio.dra.io/vf-a=02:00:00:00:00:0a"});

  // Publishing slices, call by call as the reconciler makes them: discovery, the Node (the
  // slices' owner), a list and a watch of its own slices, create, update, re-read, delete.
  ASSERT_TRUE(client_->Get("/apis/resource.k8s.io").ok());
  ASSERT_TRUE(client_->Get("/version").ok());
  auto node = client_->Get("/api/v1/nodes/node-1");
  ASSERT_TRUE(node.ok()) << node.error().message;
  const std::string base = "/apis/resource.k8s.io/v1/resourceslices";
  const std::string selector = UrlEncode("spec.nodeName=node-1,spec.driver=vfio.dra.io");
  auto list = client_->Get(base + "?fieldSelector=" + selector);
  ASSERT_TRUE(list.ok()) << list.error().message;
  const json slice = {
      {"metadata", {{"generateName", "node-1-vfio.dra.io-"}}},
      {"spec",
       {{"driver", "vfio.dra.io"},
        {"nodeName", "node-1"},
        {"pool", {{"name", "node-1"}, {"generation", 1}, {"resourceSliceCount", 1}}}}}};
  auto created = client_->Create(base, slice);
  ASSERT_TRUE(created.ok()) << created.error().message;
  const std::string path = base + "/" + (*created)["metadata"]["name"].get<std::string>();
  // The watch from the start replays the slice at once; seeing it ends the watch.
  std::stop_source stop;
  int events = 0;
  Status watched = client_->Watch(
      base + "?watch=1&fieldSelector=" + selector,
      [&](const WatchEvent&) {
        ++events;
        stop.request_stop();
        return true;
      },
      stop.get_token());
  EXPECT_TRUE(watched.ok()) << watched.error().message;
  EXPECT_EQ(events, 1);
  json update = *created;
  update["spec"]["pool"]["generation"] = 2;
  auto updated = client_->Update(path, update);
  ASSERT_TRUE(updated.ok()) << updated.error().message;
  auto reread = client_->Get(path);
  ASSERT_TRUE(reread.ok()) << reread.error().message;
  Status deleted =
      client_->Delete(path, (*reread)["metadata"]["uid"], (*reread)["metadata"]["resourceVersion"]);
  ASSERT_TRUE(deleted.ok()) << deleted.error().message;
  EXPECT_EQ(Forbidden(), 0u);

  // What the plugin never needs stays forbidden: writing a pod or a claim itself (not its
  // status), and the kubelet's wipe of a node's slices (deletecollection).
  const json object = {{"metadata", {{"name", kPod}}}};
  auto write_pod =
      client_->Call("PUT", "/api/v1/namespaces/vms/pods/" + std::string(kPod), &object);
  ASSERT_TRUE(write_pod.ok());
  EXPECT_EQ(write_pod->status, 403);
  auto wipe = client_->Call("DELETE", base + "?fieldSelector=" + selector, nullptr);
  ASSERT_TRUE(wipe.ok());
  EXPECT_EQ(wipe->status, 403);
  EXPECT_EQ(wipe->body.value("message", ""),
            std::string("resourceslices.resource.k8s.io is forbidden: ") + kForbiddenUser +
                "deletecollection resource \"resourceslices\" in API group \"resource.k8s.io\" at "
                "the cluster scope");
  auto claim_write =
      client_->Call("PATCH", "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/nic-claim",
                    &object, Deadline(), "application/merge-patch+json");
  ASSERT_TRUE(claim_write.ok());
  EXPECT_EQ(claim_write->status, 403);
}

// The reconciler itself, start to finish, with creates, updates and deletes.
TEST_F(RbacTest, TheSliceReconcilerPublishesUnderTheShippedRbac) {
  StartUnder(testing::ShippedRbacFile());
  testing::WritePciIds(dir_ + "/pci.ids");
  auto scan = [&](const std::string& fixture) {
    const std::string root = dir_ + "/" + fixture;
    if (!std::filesystem::exists(root)) {
      EXPECT_TRUE(testing::BuildFixture(fixture, root));
    }
    sysfs::SysfsReader sysfs(root);
    auto names = discovery::PciNames::Open({root, dir_ + "/pci.ids", false});
    return discovery::ScanNode(sysfs, names.ok() ? names->get() : nullptr, {});
  };
  slicepublisher::ReconcilerOptions options;
  options.driver = "vfio.dra.io";
  options.node_name = "node-1";
  options.initial_backoff = std::chrono::milliseconds(50);
  options.max_backoff = std::chrono::seconds(2);
  slicepublisher::SliceReconciler reconciler(*client_, options, Logger::Discard());
  // Each step ends when the server holds the pool the scan gives (`slices` slices; with one, of
  // `devices` devices), however many syncs it takes.
  auto publish = [&](const std::string& fixture, size_t slices, size_t devices = 0) {
    reconciler.SetScan(*scan(fixture));
    return server_->WaitForSlices(
        [&](const std::vector<json>& stored) {
          return stored.size() == slices &&
                 (devices == 0 || stored[0]["spec"]["devices"].size() == devices);
        },
        std::chrono::seconds(20));
  };
  reconciler.Start();
  ASSERT_TRUE(publish("workstation", 1, 2));  // created
  ASSERT_TRUE(publish("sriov", 1, 8));        // the slice is updated in place
  ASSERT_TRUE(publish("vgpu", 3));            // a new pool generation
  ASSERT_TRUE(publish("workstation", 1, 2));  // and another, with fewer slices
  ASSERT_TRUE(reconciler.WaitInSync(std::chrono::seconds(20))) << reconciler.Stats().last_error;
  reconciler.Stop();
  const std::string base = "/apis/resource.k8s.io/v1/resourceslices";
  EXPECT_GE(server_->CountRequests("GET", "/api/v1/nodes/node-1"), 1u);
  EXPECT_GE(server_->CountRequests("POST", base), 1u);
  EXPECT_GE(server_->CountRequests("PUT", base + "/"), 1u);
  EXPECT_GE(server_->CountRequests("DELETE", base + "/"), 1u);
  bool watched = false;
  for (const auto& r : server_->Requests()) {
    watched = watched || (r.path == base && r.query.find("watch=") != std::string::npos);
  }
  EXPECT_TRUE(watched);
  EXPECT_EQ(Forbidden(), 0u);
  EXPECT_EQ(reconciler.Stats().failed_syncs, 0u) << reconciler.Stats().last_error;
}

TEST_F(RbacTest, WithoutThePodsRuleReadingThePodIsForbidden) {
  StartUnder(ShippedRbacWithout("pods"));
  ApiPodReader reader(*client_);
  auto pod = reader.Get("vms", kPod, Deadline::After(std::chrono::seconds(10)));
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(pod.error().message.find(std::string("pods \"virt-launcher-vm1\" is forbidden: ") +
                                     kForbiddenUser +
                                     "get resource \"pods\" in API group \"\" in the namespace "
                                     "\"vms\""),
            std::string::npos)
      << pod.error().message;
  EXPECT_NE(pod.error().message.find("deploy/daemonset/rbac.yaml"), std::string::npos);
  // The body is the real server's, field for field.
  auto raw = client_->Call("GET", "/api/v1/namespaces/vms/pods/" + std::string(kPod), nullptr);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->status, 403);
  EXPECT_EQ(
      raw->body,
      json({{"kind", "Status"},
            {"apiVersion", "v1"},
            {"metadata", json::object()},
            {"status", "Failure"},
            {"message", std::string("pods \"virt-launcher-vm1\" is forbidden: ") + kForbiddenUser +
                            "get resource \"pods\" in API group \"\" in the "
                            "namespace \"vms\""},
            {"reason", "Forbidden"},
            {"details", {{"name", kPod}, {"kind", "pods"}}},
            {"code", 403}}));
  EXPECT_EQ(Forbidden(), 2u);
  // Only that rule is gone.
  ResourceClaimReader claims(*client_, *versions_);
  EXPECT_TRUE(claims.Get("vms", "nic-claim").ok());
}

TEST_F(RbacTest, WithoutTheClaimStatusRuleNothingIsApplied) {
  StartUnder(ShippedRbacWithout("resourceclaims/status"));
  Status forbidden = Apply({Ours("vf-a", "02:00:00:00:00:0a")});
  ASSERT_FALSE(forbidden.ok());
  EXPECT_EQ(forbidden.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(forbidden.error().message.find(
                std::string("resourceclaims.resource.k8s.io \"nic-claim\" is forbidden: ") +
                kForbiddenUser +
                "patch resource \"resourceclaims/status\" in API group \"resource.k8s.io\" in "
                "the namespace \"vms\""),
            std::string::npos)
      << forbidden.error().message;
  EXPECT_NE(forbidden.error().message.find("deploy/daemonset/rbac.yaml"), std::string::npos);
  EXPECT_TRUE(StoredDevices().empty());
  const auto requests = server_->Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().path, kStatusPath);
  EXPECT_EQ(requests.back().status, 403);
}

// Every other rule is needed too: without it, the call it is for is forbidden.
TEST_F(RbacTest, EveryOtherShippedRuleIsNeeded) {
  struct Case {
    std::string resource;
    std::function<Status()> call;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"resourceslices",
       [&]() -> Status {
         auto list = client_->Get("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=" +
                                  UrlEncode("spec.nodeName=node-1"));
         return list.ok() ? Status() : list.error();
       },
       std::string("resourceslices.resource.k8s.io is forbidden: ") + kForbiddenUser +
           "list resource \"resourceslices\" in API group \"resource.k8s.io\" at the cluster "
           "scope"},
      {"resourceclaims",
       [&]() -> Status {
         ResourceClaimReader reader(*client_, *versions_);
         auto claim = reader.Get("vms", "nic-claim");
         return claim.ok() ? Status() : claim.error();
       },
       std::string("resourceclaims.resource.k8s.io \"nic-claim\" is forbidden: ") + kForbiddenUser +
           "get resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace "
           "\"vms\""},
      {"nodes",
       [&]() -> Status {
         auto node = client_->Get("/api/v1/nodes/node-1");
         return node.ok() ? Status() : node.error();
       },
       std::string("nodes \"node-1\" is forbidden: ") + kForbiddenUser +
           "get resource \"nodes\" in API group \"\" at the cluster scope"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.resource);
    StartUnder(ShippedRbacWithout(c.resource));
    Status status = c.call();
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.error().kind, ErrorKind::kPermissionDenied);
    EXPECT_NE(status.error().message.find(c.message), std::string::npos) << status.error().message;
    if (c.resource == "resourceclaims") {
      EXPECT_NE(status.error().message.find("the plugin's ClusterRole needs get on resourceclaims; "
                                            "see deploy/daemonset/rbac.yaml"),
                std::string::npos)
          << status.error().message;
    }
  }
}

TEST_F(RbacTest, RulesCountOnlyWhenBoundToThePlugin) {
  // Bound to a service account of the same name in another namespace.
  StartUnder(ShippedRbacEdited("rbac-other-namespace.yaml", [](YAML::Node& doc) {
    if (doc["kind"].as<std::string>("") == "ClusterRoleBinding") {
      doc["subjects"][0]["namespace"] = "default";
    }
  }));
  ApiPodReader reader(*client_);
  auto pod = reader.Get("vms", kPod, Deadline());
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_TRUE(server_->Claim("vms", "nic-claim").is_object());
  EXPECT_FALSE(ResourceClaimReader(*client_, *versions_).Get("vms", "nic-claim").ok());

  // The shipped file, another user.
  StartUnder(testing::ShippedRbacFile(), "system:serviceaccount:vfio-dra:default");
  ApiPodReader other_user(*client_);
  pod = other_user.Get("vms", kPod, Deadline());
  ASSERT_FALSE(pod.ok());
  EXPECT_NE(pod.error().message.find(
                "User \"system:serviceaccount:vfio-dra:default\" cannot get resource \"pods\""),
            std::string::npos)
      << pod.error().message;

  // A binding whose role is not there: the denial names the missing role, as the real one does.
  StartUnder(ShippedRbacEdited("rbac-renamed-role.yaml", [](YAML::Node& doc) {
    if (doc["kind"].as<std::string>("") == "ClusterRole") doc["metadata"]["name"] = "renamed";
  }));
  auto node = client_->Get("/api/v1/nodes/node-1");
  ASSERT_FALSE(node.ok());
  EXPECT_NE(
      node.error().message.find("at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io "
                                "\"vfio-dra-plugin\" not found"),
      std::string::npos)
      << node.error().message;
  // Discovery is everyone's.
  EXPECT_TRUE(client_->Get("/version").ok());
  EXPECT_TRUE(client_->Get("/apis/resource.k8s.io/v1").ok());
}

TEST_F(RbacTest, AMalformedRbacFileFailsTheStartNamingFileAndProblem) {
  std::ifstream in(testing::ShippedRbacFile());
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string good = "resources: [\"pods\"]";
  const size_t at = text.find(good);
  ASSERT_NE(at, std::string::npos);
  const auto line = std::count(text.data(), text.data() + at, '\n') + 1;
  text.replace(at, good.size(), "resource: [\"pods\"]");  // a misspelt field
  const std::string path = dir_ + "/rbac-typo.yaml";
  std::ofstream(path) << text;

  FakeApiServerOptions options;
  options.rbac_file = path;
  FakeApiServer server(options);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(server.Start());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fake-apiserver: invalid RBAC file " + path + ":" + std::to_string(line) +
                     ": ClusterRole vfio-dra-plugin: rules[4]: unknown field \"resource\""),
            std::string::npos)
      << err;

  options.rbac_file = dir_ + "/missing.yaml";
  FakeApiServer missing(options);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(missing.Start());
  const std::string missing_err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(missing_err.find("cannot read RBAC file " + dir_ + "/missing.yaml"), std::string::npos)
      << missing_err;
}

// TLS: verification is on unless the kubeconfig turns it off; a CA file makes it pass.
TEST_F(KubeClientTest, TlsIsVerifiedAgainstTheConfiguredCa) {
  ASSERT_TRUE(MakeCertificate("server", "IP:127.0.0.1"));
  FakeApiServerOptions options;
  options.tls_cert_file = dir_ + "/server.crt";
  options.tls_key_file = dir_ + "/server.key";
  StartServer(options);
  auto untrusted = GetVersionWith("");
  ASSERT_FALSE(untrusted.ok());
  EXPECT_NE(untrusted.error().message.find("SSL"), std::string::npos) << untrusted.error().message;
  auto with_ca = GetVersionWith("    certificate-authority: " + dir_ + "/server.crt\n");
  EXPECT_TRUE(with_ca.ok()) << with_ca.error().message;
  auto with_ca_data =
      GetVersionWith("    certificate-authority-data: " + Base64File(dir_ + "/server.crt") + "\n");
  EXPECT_TRUE(with_ca_data.ok()) << with_ca_data.error().message;
  auto insecure = GetVersionWith("    insecure-skip-tls-verify: true\n");
  EXPECT_TRUE(insecure.ok());
}

// A connection is kept for the next request until it has been idle for the pool's timeout (on
// the transport's clock); the request after that opens a new one. The server's side tells them
// apart by the client's port.
TEST_F(KubeClientTest, IdleConnectionsAreReusedUntilTheyExpire) {
  StartServer({});
  testing::FakeClock clock;
  auto transport = OwnTransport(clock);
  ASSERT_NE(transport, nullptr);
  const HttpRequest get = VersionRequest();
  const auto client_port_of_a_get = [&]() {
    auto response = transport->Send(get);
    EXPECT_TRUE(response.ok() && response->status == 200);
    const auto requests = server_->Requests();
    return requests.empty() ? 0 : requests.back().client_port;
  };
  const int first = client_port_of_a_get();
  ASSERT_GT(first, 0);
  clock.Advance(HttplibTransport::kIdleClientTimeout - std::chrono::seconds(1));
  EXPECT_EQ(client_port_of_a_get(), first) << "a connection idle within the timeout was not reused";
  clock.Advance(HttplibTransport::kIdleClientTimeout);
  const int after = client_port_of_a_get();
  EXPECT_GT(after, 0);
  EXPECT_NE(after, first) << "a connection idle past the timeout was used again";
}

// The client ends of this process's TCP connections to 127.0.0.1:`port` that it has not closed
// (established, or closed by the server and not yet by us). /proc/self/net/tcp lists the whole
// network namespace, other test processes included, so only sockets among this process's file
// descriptors count.
size_t OpenConnectionsTo(int port) {
  std::set<std::string> own;  // socket inode numbers
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code unreadable;
    const std::string target = std::filesystem::read_symlink(fd.path(), unreadable).string();
    if (!unreadable && target.rfind("socket:[", 0) == 0 && target.back() == ']') {
      own.insert(target.substr(8, target.size() - 9));
    }
  }
  std::ifstream tcp("/proc/self/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  size_t open = 0;
  while (std::getline(tcp, line)) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
        timeout >> inode;
    const size_t colon = remote.find(':');
    if (colon == std::string::npos || remote.substr(0, colon) != "0100007F") continue;
    const bool to_port = std::stoi(remote.substr(colon + 1), nullptr, 16) == port;
    const bool open_here = state == "01" || state == "08";  // ESTABLISHED, CLOSE_WAIT
    if (to_port && open_here && own.count(inode) != 0) ++open;
  }
  return open;
}

// The count once it is `expected`, or after 10 s the last one seen: the kernel's table is read in
// pieces while other sockets change state, so one reading can miss an entry.
size_t OpenConnectionsSettleAt(int port, size_t expected) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const size_t open = OpenConnectionsTo(port);
    if (open == expected || std::chrono::steady_clock::now() > give_up) return open;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling a condition
  }
}

// A burst opens a connection per request in flight; once it is over, the pool keeps
// kMaxIdleClients of them and closes the rest.
TEST_F(KubeClientTest, ABurstLeavesAtMostTheIdleLimitOfConnectionsOpen) {
  constexpr size_t kBurst = HttplibTransport::kMaxIdleClients + 6;
  // Shared with the server's threads, which may outlive this test's body.
  struct Hold {
    std::mutex mu;
    std::condition_variable changed;
    size_t arrived = 0;
    bool released = false;
    std::chrono::steady_clock::time_point until;
  };
  auto hold = std::make_shared<Hold>();
  hold->until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  FakeApiServerOptions options;
  options.threads = static_cast<int>(kBurst) + 2;
  // Every request waits until the whole burst is in flight, so each has a connection of its own.
  // The one deadline only ends a test that failed (a transport that serialises requests): from
  // then on no request waits.
  options.hold_request = [hold] {
    std::unique_lock<std::mutex> lock(hold->mu);
    if (++hold->arrived >= kBurst) hold->released = true;
    hold->changed.notify_all();
    hold->changed.wait_until(lock, hold->until, [&] { return hold->released; });
    hold->released = true;
  };
  StartServer(options);
  auto transport = OwnTransport();
  ASSERT_NE(transport, nullptr);
  const HttpRequest get = VersionRequest();
  std::vector<std::thread> burst;
  std::atomic<size_t> answered{0};
  for (size_t i = 0; i < kBurst; ++i) {
    burst.emplace_back([&] {
      auto response = transport->Send(get);
      if (response.ok() && response->status == 200) ++answered;
    });
  }
  for (std::thread& request : burst) request.join();
  size_t arrived = 0;
  {
    std::lock_guard<std::mutex> lock(hold->mu);
    arrived = hold->arrived;
    hold->released = true;
  }
  hold->changed.notify_all();
  EXPECT_EQ(arrived, kBurst);
  EXPECT_EQ(answered, kBurst);
  EXPECT_EQ(OpenConnectionsSettleAt(server_->port(), HttplibTransport::kMaxIdleClients),
            HttplibTransport::kMaxIdleClients);
}

// A watch's start closes the connections idle past the timeout, as a request does: on a quiet node
// the watches' restarts are the only calls.
TEST_F(KubeClientTest, AStreamStartClosesConnectionsIdlePastTheTimeout) {
  StartServer({});
  testing::FakeClock clock;
  auto transport = OwnTransport(clock);
  ASSERT_NE(transport, nullptr);
  const HttpRequest get = VersionRequest();
  auto response = transport->Send(get);
  ASSERT_TRUE(response.ok() && response->status == 200);
  ASSERT_EQ(OpenConnectionsSettleAt(server_->port(), 1), 1u);
  clock.Advance(HttplibTransport::kIdleClientTimeout + std::chrono::seconds(1));
  std::string body;
  auto streamed = transport->Stream(
      get,
      [&](std::string_view chunk) {
        body.append(chunk);
        return true;
      },
      std::stop_token());
  ASSERT_TRUE(streamed.ok()) << streamed.error().message;
  EXPECT_NE(body.find("gitVersion"), std::string::npos) << body;
  EXPECT_EQ(OpenConnectionsSettleAt(server_->port(), 0), 0u)
      << "the connection idle past the timeout was still open after a stream";
}

// With a CA configured, only that CA is trusted: not the system's store as well (the stand-in for
// it here is SSL_CERT_FILE, which names OpenSSL's default store). Without one, the system's store
// is used, as client-go does.
TEST_F(KubeClientTest, TlsTrustsOnlyTheConfiguredCaWhenThereIsOne) {
  ASSERT_TRUE(MakeCertificate("server", "IP:127.0.0.1"));
  ASSERT_TRUE(MakeCertificate("other", "DNS:other"));
  ASSERT_EQ(::setenv("SSL_CERT_FILE", (dir_ + "/server.crt").c_str(), 1), 0);
  FakeApiServerOptions options;
  options.tls_cert_file = dir_ + "/server.crt";
  options.tls_key_file = dir_ + "/server.key";
  StartServer(options);
  auto system_store = GetVersionWith("");
  auto other_ca = GetVersionWith("    certificate-authority: " + dir_ + "/other.crt\n");
  auto other_ca_data =
      GetVersionWith("    certificate-authority-data: " + Base64File(dir_ + "/other.crt") + "\n");
  ::unsetenv("SSL_CERT_FILE");
  EXPECT_TRUE(system_store.ok()) << system_store.error().message;
  ASSERT_FALSE(other_ca.ok()) << "the system's store was trusted beside the configured CA";
  EXPECT_NE(other_ca.error().message.find("SSL"), std::string::npos) << other_ca.error().message;
  EXPECT_FALSE(other_ca_data.ok()) << "the system's store was trusted beside the configured CA";
}

// A certificate the CA signed for another address is refused: the chain alone is not enough.
TEST_F(KubeClientTest, TlsRefusesACertificateForAnotherAddress) {
  ASSERT_TRUE(MakeCertificate("server", "IP:127.0.0.2,DNS:api.example.com"));
  FakeApiServerOptions options;
  options.tls_cert_file = dir_ + "/server.crt";
  options.tls_key_file = dir_ + "/server.key";
  StartServer(options);
  auto wrong_name = GetVersionWith("    certificate-authority: " + dir_ + "/server.crt\n");
  ASSERT_FALSE(wrong_name.ok());
  EXPECT_NE(wrong_name.error().message.find("does not name 127.0.0.1"), std::string::npos)
      << wrong_name.error().message;
}

// A server that requires client certificates gets ours, from files or inline data; without one
// the handshake fails.
TEST_F(KubeClientTest, TlsPresentsTheClientCertificate) {
  ASSERT_TRUE(MakeCertificate("server", "IP:127.0.0.1"));
  ASSERT_TRUE(MakeCertificate("client", "DNS:node1"));
  FakeApiServerOptions options;
  options.tls_cert_file = dir_ + "/server.crt";
  options.tls_key_file = dir_ + "/server.key";
  options.tls_client_ca_file = dir_ + "/client.crt";
  StartServer(options);
  const std::string ca = "    certificate-authority: " + dir_ + "/server.crt\n";
  auto without = GetVersionWith(ca);
  EXPECT_FALSE(without.ok());
  auto from_files = GetVersionWith(
      ca, "{client-certificate: " + dir_ + "/client.crt, client-key: " + dir_ + "/client.key}");
  EXPECT_TRUE(from_files.ok()) << from_files.error().message;
  auto inline_data =
      GetVersionWith(ca, "{client-certificate-data: " + Base64File(dir_ + "/client.crt") +
                             ", client-key-data: " + Base64File(dir_ + "/client.key") + "}");
  EXPECT_TRUE(inline_data.ok()) << inline_data.error().message;
  // A key that is not the certificate's is refused before any connection, naming the config.
  ASSERT_TRUE(MakeCertificate("other", "DNS:other"));
  auto mismatched = GetVersionWith(
      ca, "{client-certificate: " + dir_ + "/client.crt, client-key: " + dir_ + "/other.key}");
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.error().message.find("does not belong to the client certificate"),
            std::string::npos)
      << mismatched.error().message;
}

}  // namespace
}  // namespace vfio_dra::kube
