// The real vfio-dra-plugin binary, driven by the kubelet simulator over its unix sockets and
// backed by the fake API server: registration, both DRA API versions, per-claim semantics,
// concurrency, malformed requests, shutdown and socket hygiene. The fake API server, not a real
// one: the tests need claims in states no real scheduler produces (malformed, half-allocated,
// deleted mid-call) and API faults on demand; test/cluster covers the real server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "fake_apiserver.h"
#include "integration/daemon_process.h"
#include "kubelet_simulator.h"
#include "pluginregistration.pb.h"
#include "sysfs_fixture.h"

namespace vfio_dra::testing {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kDriver = "vfio.dra.io";

json AllocatedClaim(const std::string& name, const std::string& uid, const std::string& driver) {
  return {{"metadata", {{"namespace", "vms"}, {"name", name}, {"uid", uid}}},
          {"spec", {{"devices", {{"requests", {{{"name", "gpu"}}}}}}}},
          {"status",
           {{"allocation",
             {{"devices",
               {{"results",
                 {{{"request", "gpu"},
                   {"driver", driver},
                   {"pool", "node1"},
                   {"device", "gpu-0000-3b-00-0"}}}}}}}}}}};
}

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// Leaves a socket file behind, as a crashed instance would.
void CreateDeadSocket(const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);
}

class PluginDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-it-XXXXXX";
    dir_ = mkdtemp(tmpl);
    registrar_ = dir_ + "/plugins_registry";
    data_dir_ = dir_ + "/plugins/" + kDriver;
    std::filesystem::create_directories(registrar_);
    // Under the shipped RBAC: a call the plugin's ClusterRole does not allow fails the test.
    FakeApiServerOptions options;
    options.rbac_file = ShippedRbacFile();
    server_ = std::make_unique<FakeApiServer>(options);
    ASSERT_TRUE(server_->Start());
    kubeconfig_ = server_->WriteKubeconfig(dir_);
  }
  void TearDown() override {
    daemons_.clear();
    for (const RecordedRequest& r : server_->Requests()) {
      EXPECT_NE(r.status, 403) << r.method << " " << r.path << " is not allowed by rbac.yaml";
    }
    server_->Stop();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::vector<std::string> Args(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args =
        ServeCommand(VFIO_DRA_PLUGIN_BINARY, kubeconfig_, registrar_, data_dir_, dir_);
    args.insert(args.end(), {"--metrics-address", "127.0.0.1:0", "-v", "4"});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  DaemonProcess& StartDaemon(const std::vector<std::string>& extra = {}) {
    const std::string log = dir_ + "/daemon-" + std::to_string(daemons_.size()) + ".log";
    daemons_.push_back(std::make_unique<DaemonProcess>(Args(extra), log));
    return *daemons_.back();
  }
  RegisteredPlugin StartAndRegister(KubeletSimulator& sim) {
    DaemonProcess& daemon = StartDaemon();
    auto socket = sim.WaitForRegistrationSocket(registrar_, std::chrono::seconds(20));
    EXPECT_TRUE(socket.ok()) << daemon.Log();
    auto plugin = sim.Register(*socket);
    EXPECT_TRUE(plugin.ok()) << plugin.error().message << "\n" << daemon.Log();
    return *plugin;
  }

  std::string dir_, registrar_, data_dir_, kubeconfig_;
  std::unique_ptr<FakeApiServer> server_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

TEST_F(PluginDaemonTest, GetInfoAnswersAsTheKubeletExpects) {
  KubeletSimulator sim;
  DaemonProcess& daemon = StartDaemon();
  auto socket = sim.WaitForRegistrationSocket(registrar_, std::chrono::seconds(20));
  ASSERT_TRUE(socket.ok()) << daemon.Log();
  EXPECT_EQ(*socket, registrar_ + "/vfio.dra.io-reg.sock");
  // The DRA socket must already be there when the registration socket appears.
  EXPECT_TRUE(IsSocket(data_dir_ + "/dra.sock"));
  std::string bytes;
  // The socket is bound at its final name an instant before it listens: the call waits for it to
  // accept, as the kubelet's blocking dial does (it failed once, refused, 44 ms into the test).
  ASSERT_TRUE(sim.CallRaw(*socket, "/pluginregistration.Registration/GetInfo", "", &bytes,
                          std::chrono::seconds(20), /*wait_for_ready=*/true)
                  .ok());
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(info.ParseFromString(bytes));
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), kDriver);
  EXPECT_EQ(info.endpoint(), data_dir_ + "/dra.sock");
  EXPECT_THAT(info.supported_versions(),
              ElementsAre("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                          "v1alpha1.DRAResourceHealth"));
  auto plugin = sim.Register(*socket);
  ASSERT_TRUE(plugin.ok());
  EXPECT_EQ(plugin->chosen_service, "v1.DRAPlugin");
  EXPECT_EQ(plugin->health_service, "v1.DRAResourceHealth");
  EXPECT_THAT(daemon.Log(), HasSubstr("registered with the kubelet"));
  struct stat st {};
  ASSERT_EQ(::stat((data_dir_ + "/dra.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(PluginDaemonTest, AKubeletWithoutV1PicksV1beta1) {
  KubeletSimulator old_kubelet({"v1beta1.DRAPlugin"});
  StartDaemon();
  auto socket = old_kubelet.WaitForRegistrationSocket(registrar_, std::chrono::seconds(20));
  ASSERT_TRUE(socket.ok());
  auto plugin = old_kubelet.Register(*socket);
  ASSERT_TRUE(plugin.ok());
  EXPECT_EQ(plugin->chosen_service, "v1beta1.DRAPlugin");
}

TEST_F(PluginDaemonTest, OneImplementationAnswersBothVersionsClaimByClaim) {
  server_->PutClaim(AllocatedClaim("ours", "u-ours", kDriver));
  server_->PutClaim(AllocatedClaim("theirs", "u-theirs", "gpu.other.io"));
  json pending = AllocatedClaim("pending", "u-pending", kDriver);
  pending["status"] = json::object();
  server_->PutClaim(pending);
  server_->PutClaim(AllocatedClaim("replaced", "u-new", kDriver));
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  const std::vector<SimClaim> claims = {{"vms", "ours", "u-ours"},
                                        {"vms", "theirs", "u-theirs"},
                                        {"vms", "pending", "u-pending"},
                                        {"vms", "replaced", "u-old"},
                                        {"vms", "missing", "u-missing"}};
  for (const std::string service : {"v1.DRAPlugin", "v1beta1.DRAPlugin"}) {
    SCOPED_TRACE(service);
    auto response = sim.Prepare(plugin, claims, service);
    ASSERT_TRUE(response.ok()) << response.error().message;
    const auto& results = response->claims();
    ASSERT_EQ(results.size(), claims.size());
    // The node (an empty sysfs tree) has no such device.
    EXPECT_THAT(results.at("u-ours").error(), HasSubstr("published"));
    EXPECT_THAT(results.at("u-ours").error(), HasSubstr("vms/ours"));
    EXPECT_EQ(results.at("u-theirs").error(), "");
    EXPECT_EQ(results.at("u-theirs").devices_size(), 0);
    EXPECT_THAT(results.at("u-pending").error(), HasSubstr("not allocated"));
    EXPECT_THAT(results.at("u-old").error(), HasSubstr("replaced"));
    EXPECT_THAT(results.at("u-missing").error(), HasSubstr("vms/missing not found"));
    auto unprepared = sim.Unprepare(plugin, claims, service);
    ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
    ASSERT_EQ(unprepared->claims().size(), claims.size());
    for (const auto& [uid, result] : unprepared->claims()) EXPECT_EQ(result.error(), "") << uid;
  }
}

// A 1.37+ kubelet watches the health stream through v1, an older one through v1alpha1; both get
// the complete list from the one daemon.
TEST_F(PluginDaemonTest, TheHealthStreamListsEveryPublishedDeviceAndGrpcHealthSaysServing) {
  BuildVgpuNode(dir_ + "/sys");
  server_->PutNode("node1", "node1-uid");
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  EXPECT_EQ(plugin.health_service, "v1.DRAResourceHealth");
  KubeletSimulator older_kubelet({"v1.DRAPlugin", "v1beta1.DRAPlugin"},
                                 {"v1alpha1.DRAResourceHealth"});
  auto older = older_kubelet.Register(plugin.registration_socket);
  ASSERT_TRUE(older.ok()) << older.error().message;
  EXPECT_EQ(older->health_service, "v1alpha1.DRAResourceHealth");
  ASSERT_TRUE(
      server_->WaitForSlices([](const auto& s) { return s.size() == 3; }, std::chrono::seconds(20)))
      << daemons_[0]->Log();
  std::set<std::string> published;
  for (const json& slice : server_->Slices()) {
    for (const json& device : slice["spec"].value("devices", json::array())) {
      published.insert(device["name"].get<std::string>());
    }
  }
  for (auto [kubelet, registered] :
       {std::pair{&sim, &plugin}, std::pair{&older_kubelet, &*older}}) {
    SCOPED_TRACE(registered->health_service);
    auto messages = kubelet->WatchHealth(
        *registered, [](const auto& m) { return m.devices_size() > 0; }, std::chrono::seconds(20));
    ASSERT_TRUE(messages.ok()) << messages.error().message << daemons_[0]->Log();
    const auto& last = messages->back();
    std::set<std::string> names;
    for (const auto& device : last.devices()) {
      EXPECT_EQ(device.device().pool_name(), "node1");
      EXPECT_EQ(device.health(), v1::HEALTHY) << device.device().device_name();
      EXPECT_GT(device.last_updated_time(), 1700000000);
      EXPECT_GE(device.health_check_timeout_seconds(), 15);
      names.insert(device.device().device_name());
    }
    EXPECT_EQ(names, published);
  }

  // grpc.health.v1.Health/Check for the server as a whole ("" service): SERVING is field 1 = 1.
  std::string response;
  grpc::Status status = sim.CallRaw(plugin.endpoint, "/grpc.health.v1.Health/Check", "", &response,
                                    std::chrono::seconds(2));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response, std::string("\x08\x01", 2));
}

TEST_F(PluginDaemonTest, ApiServerDownThenUp) {
  server_->PutClaim(AllocatedClaim("theirs", "u-1", "gpu.other.io"));
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  const int port = server_->port();
  server_->Stop();
  auto down = sim.Prepare(plugin, {{"vms", "theirs", "u-1"}});
  ASSERT_TRUE(down.ok()) << down.error().message;
  EXPECT_THAT(down->claims().at("u-1").error(), HasSubstr("cannot get ResourceClaim vms/theirs"));
  ASSERT_TRUE(server_->Start(port));
  auto up = sim.Prepare(plugin, {{"vms", "theirs", "u-1"}});
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->claims().at("u-1").error(), "");
}

TEST_F(PluginDaemonTest, ThirtyTwoConcurrentPreparesAllGetTheirAnswer) {
  for (int i = 0; i < 32; ++i) {
    server_->PutClaim(AllocatedClaim("c" + std::to_string(i), "u" + std::to_string(i),
                                     i % 2 ? kDriver : "gpu.other.io"));
  }
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  std::vector<std::thread> pods;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 32; ++i) {
    pods.emplace_back([&, i] {
      const std::string uid = "u" + std::to_string(i);
      auto response = sim.Prepare(plugin, {{"vms", "c" + std::to_string(i), uid}});
      if (!response.ok() || response->claims().size() != 1 || !response->claims().contains(uid)) {
        ++wrong;
        return;
      }
      const std::string& error = response->claims().at(uid).error();
      const bool expected = i % 2 ? error.find("published") != std::string::npos : error.empty();
      if (!expected) ++wrong;
    });
  }
  for (auto& t : pods) t.join();
  EXPECT_EQ(wrong, 0);
}

TEST_F(PluginDaemonTest, MalformedRequestsAreRejectedCleanly) {
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  auto empty_uid = sim.Prepare(plugin, {{"vms", "a", ""}});
  ASSERT_FALSE(empty_uid.ok());
  EXPECT_EQ(empty_uid.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_THAT(empty_uid.error().message, HasSubstr("empty uid"));

  std::vector<SimClaim> many;
  for (int i = 0; i < 10000; ++i) many.push_back({"vms", "c", "u-" + std::to_string(i)});
  auto too_many = sim.Unprepare(plugin, many);
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(too_many.error().message, HasSubstr("10000 claims"));

  const std::vector<SimClaim> bad = {{"vms", "a/b", "u-1"},
                                     {"vms", "..", "u-2"},
                                     {"vms", std::string("x\0y", 3), "u-3"},
                                     {"../..", "c", "u-4"}};
  auto response = sim.Prepare(plugin, bad);
  ASSERT_TRUE(response.ok());
  ASSERT_EQ(response->claims().size(), bad.size());
  for (const auto& [uid, result] : response->claims()) {
    EXPECT_THAT(result.error(), HasSubstr("invalid")) << uid;
  }
  // No claim lookup reached the API server.
  EXPECT_EQ(server_->CountRequests("GET", "/apis/resource.k8s.io/v1/namespaces/"), 0u);
  // And the daemon is still serving.
  EXPECT_TRUE(sim.Unprepare(plugin, {{"vms", "ok", "u-ok"}}).ok());
}

TEST_F(PluginDaemonTest, SigtermRemovesBothSocketsAndLeavesSlices) {
  server_->PutNode("node1", "node-uid");
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  DaemonProcess& daemon = *daemons_.back();
  ASSERT_TRUE(IsSocket(plugin.registration_socket));
  ASSERT_TRUE(IsSocket(plugin.endpoint));
  ASSERT_TRUE(daemon.Signal(SIGTERM));
  auto code = daemon.WaitForExit(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << daemon.Log();
  EXPECT_FALSE(std::filesystem::exists(plugin.registration_socket));
  EXPECT_FALSE(std::filesystem::exists(plugin.endpoint));
  EXPECT_THAT(daemon.Log(), HasSubstr("ResourceSlices stay in place"));
  EXPECT_EQ(server_->CountRequests("DELETE", "/apis/resource.k8s.io/"), 0u);
}

TEST_F(PluginDaemonTest, StaleSocketsFromACrashedInstanceAreReplaced) {
  CreateDeadSocket(data_dir_ + "/dra.sock");
  CreateDeadSocket(registrar_ + "/vfio.dra.io-reg.sock");
  KubeletSimulator sim;
  DaemonProcess& daemon = StartDaemon();
  // The stale registration socket exists from the start; the simulator's blocking dial (as the
  // kubelet's) connects once the daemon has replaced it with a live one.
  auto plugin = sim.Register(registrar_ + "/vfio.dra.io-reg.sock");
  ASSERT_TRUE(plugin.ok()) << plugin.error().message << "\n" << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("registered with the kubelet"));
  EXPECT_TRUE(sim.Unprepare(*plugin, {{"vms", "c", "u"}}).ok());
}

TEST_F(PluginDaemonTest, AFileThatIsNotASocketIsNeverDeleted) {
  std::filesystem::create_directories(data_dir_);
  std::ofstream(data_dir_ + "/dra.sock") << "precious";
  DaemonProcess& daemon = StartDaemon();
  auto code = daemon.WaitForExit(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(daemon.Log(), HasSubstr(data_dir_ + "/dra.sock exists and is not a socket"));
  std::ifstream in(data_dir_ + "/dra.sock");
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

TEST_F(PluginDaemonTest, ARejectedRegistrationIsLoggedWithTheKubeletsReason) {
  KubeletSimulator sim;
  DaemonProcess& daemon = StartDaemon();
  auto socket = sim.WaitForRegistrationSocket(registrar_, std::chrono::seconds(20));
  ASSERT_TRUE(socket.ok());
  ASSERT_TRUE(sim.Reject(*socket, "none of services supported").ok());
  const std::string log = daemon.Log();
  EXPECT_THAT(log, HasSubstr(" error registration \"the kubelet rejected the registration\""));
  EXPECT_THAT(log, HasSubstr("reason=\"none of services supported\""));
}

TEST_F(PluginDaemonTest, TwoInstancesOverlapDuringARollingUpdate) {
  StartDaemon({"--pod-uid", "old-pod"});
  StartDaemon({"--pod-uid", "new-pod"});
  server_->PutClaim(AllocatedClaim("theirs", "u-1", "gpu.other.io"));
  KubeletSimulator sim;
  std::vector<RegisteredPlugin> plugins;
  for (const std::string uid : {"old-pod", "new-pod"}) {
    const std::string socket = registrar_ + "/vfio.dra.io-" + uid + "-reg.sock";
    auto plugin = sim.Register(socket);
    ASSERT_TRUE(plugin.ok()) << plugin.error().message;
    EXPECT_EQ(plugin->endpoint, data_dir_ + "/dra-" + uid + ".sock");
    plugins.push_back(*plugin);
  }
  for (const auto& plugin : plugins) {
    auto response = sim.Prepare(plugin, {{"vms", "theirs", "u-1"}});
    ASSERT_TRUE(response.ok());
    EXPECT_EQ(response->claims().at("u-1").error(), "");
  }
  // The old instance goes away and removes only its own sockets.
  ASSERT_TRUE(daemons_[0]->Signal(SIGTERM));
  ASSERT_EQ(daemons_[0]->WaitForExit(std::chrono::seconds(20)), 0);
  EXPECT_FALSE(std::filesystem::exists(plugins[0].endpoint));
  EXPECT_TRUE(IsSocket(plugins[1].endpoint));
  EXPECT_TRUE(IsSocket(plugins[1].registration_socket));
  EXPECT_TRUE(sim.Prepare(plugins[1], {{"vms", "theirs", "u-1"}}).ok());
}

TEST_F(PluginDaemonTest, AnInvalidPolicyKeepsServeFromStarting) {
  std::ofstream(dir_ + "/policy.yaml") << "kinds:\n  gpu: yes please\n";
  DaemonProcess& daemon = StartDaemon({"--config", dir_ + "/policy.yaml"});
  auto code = daemon.WaitForExit(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(daemon.Log(), HasSubstr(dir_ + "/policy.yaml:2: kinds.gpu: must be true or false"));
  EXPECT_FALSE(std::filesystem::exists(registrar_ + "/vfio.dra.io-reg.sock"));
}

TEST_F(PluginDaemonTest, ServeDiscoversTheNodeUnderThePolicy) {
  BuildWorkstation(dir_ + "/sys");
  std::ofstream(dir_ + "/policy.yaml") << "select:\n  - kind: hostdev\n    class: \"0108\"\n";
  server_->PutNode("node1", "node1-uid");
  KubeletSimulator sim;
  DaemonProcess& daemon = StartDaemon({"--config", dir_ + "/policy.yaml"});
  auto socket = sim.WaitForRegistrationSocket(registrar_, std::chrono::seconds(20));
  ASSERT_TRUE(socket.ok());
  // The first scan is logged before its slices are written.
  ASSERT_TRUE(
      server_->WaitForSlices([](const auto& s) { return !s.empty(); }, std::chrono::seconds(20)))
      << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("node devices\" pci_devices=3 mdev_types=0"));
}

TEST_F(PluginDaemonTest, ServePublishesTheNodesSlicesAndLeavesThemOnShutdown) {
  BuildVgpuNode(dir_ + "/sys");
  server_->PutNode("node1", "node1-uid");
  KubeletSimulator sim;
  RegisteredPlugin plugin = StartAndRegister(sim);
  DaemonProcess& daemon = *daemons_.back();
  // The reconciler publishes in the background; the full set is 3 slices (1.35 layout).
  ASSERT_TRUE(
      server_->WaitForSlices([](const auto& s) { return s.size() == 3; }, std::chrono::seconds(20)))
      << daemon.Log();
  const std::vector<json> slices = server_->Slices();
  for (const json& slice : slices) {
    EXPECT_EQ(slice["spec"]["nodeName"], "node1");
    EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], "node1-uid");
  }
  ASSERT_TRUE(daemon.Signal(SIGTERM));
  ASSERT_EQ(daemon.WaitForExit(std::chrono::seconds(20)), 0);
  EXPECT_EQ(server_->Slices().size(), 3u);
}

TEST(PluginCli, BadFlagsAreOneLineAndExitTwo) {
  auto unknown = RunCommand({VFIO_DRA_PLUGIN_BINARY, "serve", "--bogus"}, std::chrono::seconds(10));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("--bogus"));
  EXPECT_EQ(std::count(unknown.output.begin(), unknown.output.end(), '\n'), 1);
  auto bad_driver = RunCommand(
      {VFIO_DRA_PLUGIN_BINARY, "serve", "--node-name", "n", "--driver-name", "Not_Valid"},
      std::chrono::seconds(10));
  EXPECT_EQ(bad_driver.exit_code, 2);
  EXPECT_THAT(bad_driver.output, HasSubstr("--driver-name: must be a lower-case DNS subdomain"));
  auto no_node = RunCommand({VFIO_DRA_PLUGIN_BINARY, "serve"}, std::chrono::seconds(10));
  EXPECT_EQ(no_node.exit_code, 2);
  EXPECT_THAT(no_node.output, HasSubstr("--node-name: is required"));
  auto bad_number =
      RunCommand({VFIO_DRA_PLUGIN_BINARY, "serve", "--node-name", "n", "--kube-api-qps", "fast"},
                 std::chrono::seconds(10));
  EXPECT_EQ(bad_number.exit_code, 2);
  EXPECT_THAT(bad_number.output, HasSubstr("--kube-api-qps"));
}

TEST(PluginCli, HelpAndVersion) {
  auto help = RunCommand({VFIO_DRA_PLUGIN_BINARY, "serve", "--help"}, std::chrono::seconds(10));
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag :
       {"--driver-name", "--node-name", "--kubeconfig", "--sysfs-root", "--dev-root",
        "--registrar-dir", "--plugin-data-dir", "--cdi-dir", "--config", "--pod-uid", "-v,--v"}) {
    EXPECT_THAT(help.output, HasSubstr(flag));
  }
  auto version = RunCommand({VFIO_DRA_PLUGIN_BINARY, "version"}, std::chrono::seconds(10));
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_THAT(version.output, HasSubstr("vfio-dra-plugin 0."));
  auto version_help =
      RunCommand({VFIO_DRA_PLUGIN_BINARY, "version", "--help"}, std::chrono::seconds(10));
  EXPECT_EQ(version_help.exit_code, 0);
}

}  // namespace
}  // namespace vfio_dra::testing
