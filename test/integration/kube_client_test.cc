// The API client against the fake API server over real HTTP on loopback.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stop_token>
#include <thread>

#include "cmd/serve_command.h"
#include "fake_apiserver.h"
#include "kube/api_client.h"
#include "kube/claim_reader.h"
#include "kube/client_config.h"
#include "kube/curl_transport.h"

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
    auto transport = CurlTransport::Create(*config, cmd::UserAgent());
    ASSERT_TRUE(transport.ok()) << transport.error().message;
    transport_ = std::move(*transport);
    tokens_ = std::make_unique<TokenSource>(config->token, config->token_file, RealClock());
    ApiClientOptions options;
    options.initial_backoff = std::chrono::milliseconds(5);
    options.max_backoff = std::chrono::milliseconds(20);
    options.max_retries = max_retries;
    client_ =
        std::make_unique<ApiClient>(*transport_, *tokens_, RealClock(), Logger::Discard(), options);
  }

  std::string dir_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<CurlTransport> transport_;
  std::unique_ptr<TokenSource> tokens_;
  std::unique_ptr<ApiClient> client_;
};

TEST_F(KubeClientTest, ReadsClaimsFromTheNewestServedVersionAndRemembersIt) {
  FakeApiServerOptions options;
  options.served_versions = {"v1beta1"};  // a 1.32 cluster
  StartServer(options);
  Connect();
  server_->PutClaim(ClaimJson("vms", "c1", "u1"));
  server_->PutClaim(ClaimJson("vms", "c2", "u2"));
  ResourceClaimReader reader(*client_);
  auto first = reader.Get("vms", "c1");
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->uid, "u1");
  EXPECT_EQ(first->api_version, "resource.k8s.io/v1beta1");
  EXPECT_EQ(reader.ServedVersion(), "v1beta1");
  EXPECT_EQ(server_->CountRequests("GET", "/apis/resource.k8s.io/"), 3u);  // v1, v1beta2, v1beta1
  server_->ClearRequests();
  ASSERT_TRUE(reader.Get("vms", "c2").ok());
  EXPECT_EQ(server_->CountRequests("GET", "/apis/resource.k8s.io/"), 1u);
}

TEST_F(KubeClientTest, MissingClaimIsNotFoundNamingIt) {
  StartServer({});
  Connect();
  ResourceClaimReader reader(*client_);
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
  ResourceClaimReader reader(*client_);
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

// TLS: verification is on unless the kubeconfig turns it off; a CA file makes it pass.
TEST_F(KubeClientTest, TlsIsVerifiedAgainstTheConfiguredCa) {
  const std::string make_cert =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=fake-apiserver "
      "-addext subjectAltName=IP:127.0.0.1 -keyout " +
      dir_ + "/key.pem -out " + dir_ + "/cert.pem 2>/dev/null";
  ASSERT_EQ(std::system(make_cert.c_str()), 0) << "openssl is needed (hack/install-deps.sh)";
  FakeApiServerOptions options;
  options.tls_cert_file = dir_ + "/cert.pem";
  options.tls_key_file = dir_ + "/key.pem";
  StartServer(options);
  auto connect_with = [&](const std::string& cluster_extra) -> Result<nlohmann::json> {
    const std::string path = dir_ + "/tls-kubeconfig";
    std::ofstream(path, std::ios::trunc)
        << "current-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
        << "clusters:\n- name: k\n  cluster:\n    server: " << server_->url() << "\n"
        << cluster_extra << "users:\n- name: u\n  user: {}\n";
    auto config = LoadKubeconfigFile(path);
    if (!config.ok()) return config.error();
    auto transport = CurlTransport::Create(*config, "test");
    if (!transport.ok()) return transport.error();
    TokenSource tokens("", "", RealClock());
    ApiClientOptions api_options;
    api_options.max_retries = 0;
    ApiClient client(**transport, tokens, RealClock(), Logger::Discard(), api_options);
    return client.Get("/version");
  };
  auto untrusted = connect_with("");
  ASSERT_FALSE(untrusted.ok());
  EXPECT_NE(untrusted.error().message.find("SSL"), std::string::npos) << untrusted.error().message;
  auto with_ca = connect_with("    certificate-authority: " + dir_ + "/cert.pem\n");
  EXPECT_TRUE(with_ca.ok()) << with_ca.error().message;
  auto insecure = connect_with("    insecure-skip-tls-verify: true\n");
  EXPECT_TRUE(insecure.ok());
}

}  // namespace
}  // namespace vfio_dra::kube
