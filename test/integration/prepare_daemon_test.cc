// Device preparation through the daemon process: the real command line (vfio-dra-sim-daemon is
// vfio-dra-plugin with the SimulatedKernel), the kubelet simulator on its sockets, and the fake
// API server. A claim of each kind is prepared and unprepared, and the crash-safety test kills
// the daemon with SIGKILL before every single step of prepare and unprepare, restarts it, lets
// the kubelet retry, and checks that the claim ends prepared (or unprepared) with nothing on the
// node that the checkpoint does not account for. The fake API server, not a real one: the
// crash tests restart daemons hundreds of times against claims put in place directly (no
// scheduler), and some inject API faults; test/cluster prepares claims the real scheduler made.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "base/file_lock.h"
#include "cmd/malloc_tuning.h"
#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "fake_apiserver.h"
#include "integration/daemon_process.h"
#include "kubelet_simulator.h"
#include "simulated_kernel.h"
#include "slicepublisher/slice_builder.h"
#include "step_pause.h"
#include "sysfs_fixture.h"

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kDriver = "vfio.dra.io";
constexpr const char* kPolicy =
    "version: v1\n"
    "select:\n"
    "  - kind: hostdev\n"
    "    address: \"0000:06:00.0\"\n"
    // The vgpu-vf fixture's idle H100 offers 40C (2 per GPU) on VFs 4 and 5.
    "  - kind: vgpu\n"
    "    pf: \"0000:41:00.0\"\n"
    "    vgpuType: \"1415\"\n";

// Host drivers of the vm-host fixture's managed functions.
const std::map<std::string, std::string>& HostDrivers() {
  static const std::map<std::string, std::string> kDrivers = {{"0000:01:00.0", "nvidia"},
                                                              {"0000:01:00.1", "snd_hda_intel"},
                                                              {"0000:5e:02.1", "iavf"},
                                                              {"0000:06:00.0", "nvme"}};
  return kDrivers;
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json Claim(const std::string& name, const std::string& uid,
           const std::vector<std::pair<std::string, std::string>>& results) {
  json out = json::array();
  for (const auto& [request, device] : results) {
    out.push_back(
        {{"request", request}, {"driver", kDriver}, {"pool", "node1"}, {"device", device}});
  }
  return {{"metadata", {{"namespace", "vms"}, {"name", name}, {"uid", uid}, {"generation", 1}}},
          {"spec", json::object()},
          {"status", {{"allocation", {{"devices", {{"results", out}}}}}}}};
}

class PrepareDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-prep-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // Under the shipped RBAC: a call the plugin's ClusterRole does not allow fails the test.
    FakeApiServerOptions options;
    options.rbac_file = ShippedRbacFile();
    server_ = std::make_unique<FakeApiServer>(options);
    ASSERT_TRUE(server_->Start());
    kubeconfig_ = server_->WriteKubeconfig(dir_);
    server_->PutNode("node1", "6a0a1d47-0000-4000-8000-0000000000aa");
    std::ofstream(dir_ + "/policy.yaml") << kPolicy;
    FreshNode();
  }
  void TearDown() override {
    daemon_.reset();
    second_.reset();
    for (const RecordedRequest& r : server_->Requests()) {
      if (r.injected) continue;
      EXPECT_NE(r.status, 403) << r.method << " " << r.path << " is not allowed by rbac.yaml";
    }
    server_->Stop();
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // A node as it boots: the fixture tree, empty /dev/vfio, CDI and plugin data directories.
  void FreshNode() {
    daemon_.reset();
    second_.reset();
    for (const char* sub : {"sys", "dev", "cdi", "data", "registry", "registry-b"})
      fs::remove_all(dir_ + "/" + sub);
    fs::remove(dir_ + "/sys.sim.json");
    fs::remove(dir_ + "/sys.vgpu-vf-types");
    BuildFixture(fixture_, dir_ + "/sys");
    fs::create_directories(dir_ + "/registry");
  }
  void StartDaemon(const std::vector<std::string>& env = {}) {
    daemon_.reset();
    StartInstance(env, "registry", {}, daemon_, plugin_);
  }
  // The other instance of a rolling update: its own registration directory and --pod-uid (so its
  // sockets have their own names), the same plugin data, CDI and sysfs directories.
  void StartSecondInstance() {
    second_.reset();
    StartInstance({}, "registry-b", {"--pod-uid", "b"}, second_, second_plugin_);
  }
  void StartInstance(const std::vector<std::string>& env, const std::string& registry,
                     const std::vector<std::string>& extra, std::unique_ptr<DaemonProcess>& daemon,
                     RegisteredPlugin& plugin_out) {
    LaunchInstance(env, registry, extra, daemon);
    ConnectInstance(registry, *daemon, plugin_out);
  }
  // StartInstance in two halves, for a daemon that pauses before it registers (in recovery).
  void LaunchInstance(const std::vector<std::string>& env, const std::string& registry,
                      const std::vector<std::string>& extra,
                      std::unique_ptr<DaemonProcess>& daemon) {
    fs::create_directories(dir_ + "/" + registry);
    // The kubelet forgets a plugin whose socket died; a crashed daemon leaves the file behind.
    for (const auto& entry : fs::directory_iterator(dir_ + "/" + registry)) {
      fs::remove(entry.path());
    }
    const std::string log = dir_ + "/daemon-" + std::to_string(++starts_) + ".log";
    std::vector<std::string> argv = ServeCommand(VFIO_DRA_SIM_DAEMON_BINARY, kubeconfig_,
                                                 dir_ + "/" + registry, dir_ + "/data", dir_);
    argv.insert(argv.end(), {"--config", dir_ + "/policy.yaml", "--unbind-timeout", "2",
                             "--metrics-address", "127.0.0.1:0", "--health-interval", "1"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), every_instance_args_.begin(), every_instance_args_.end());
    daemon = std::make_unique<DaemonProcess>(argv, log, env);
  }
  void ConnectInstance(const std::string& registry, const DaemonProcess& daemon,
                       RegisteredPlugin& plugin_out) {
    auto socket = sim_.WaitForRegistrationSocket(dir_ + "/" + registry, std::chrono::seconds(20));
    ASSERT_TRUE(socket.ok()) << socket.error().message << daemon.Log();
    auto plugin = sim_.Register(*socket);
    ASSERT_TRUE(plugin.ok()) << plugin.error().message << daemon.Log();
    plugin_out = *plugin;
  }
  // The port of the daemon's /metrics endpoint, from its log; 0 when it is not there.
  int MetricsPort() const {
    std::smatch match;
    const std::string log = daemon_->Log();
    if (!std::regex_search(log, match,
                           std::regex("endpoint listening\" address=127.0.0.1:(\\d+)"))) {
      return 0;
    }
    return std::stoi(match[1]);
  }
  std::string Driver(const std::string& address) const {
    std::error_code ec;
    auto target = fs::read_symlink(dir_ + "/sys/bus/pci/devices/" + address + "/driver", ec);
    return ec ? "" : target.filename().string();
  }
  // Every claim's record, by UID (the records of <data>/claims, one file per claim).
  json Checkpoint() const {
    json claims = json::object();
    if (fs::exists(dir_ + "/data/claims")) {
      for (const auto& e : fs::directory_iterator(dir_ + "/data/claims")) {
        const std::string name = e.path().filename();
        if (name.size() < 6 || name[0] == '.' || name.substr(name.size() - 5) != ".json") continue;
        claims[name.substr(0, name.size() - 5)] = json::parse(Slurp(e.path()))["claim"];
      }
    }
    return json{{"claims", claims}};
  }
  std::vector<std::string> CdiFiles() const {
    std::vector<std::string> files;
    if (!fs::exists(dir_ + "/cdi")) return files;
    for (const auto& e : fs::directory_iterator(dir_ + "/cdi"))
      files.push_back(e.path().filename());
    return files;
  }
  // The crash-safety invariants: every function is on its host driver unless the checkpoint
  // records it, and every CDI spec belongs to a checkpoint entry.
  void ExpectAccountedFor(const std::string& when) const {
    SCOPED_TRACE(when);
    const json checkpoint = Checkpoint();
    std::set<std::string> recorded;
    std::set<std::string> files;
    std::set<std::string> vgpus;
    for (const auto& [uid, claim] : checkpoint["claims"].items()) {
      for (const json& f : claim["functions"]) recorded.insert(f["address"]);
      for (const json& f : claim["cdiFiles"]) files.insert(f);
      for (const json& v : claim.value("vgpus", json::array())) vgpus.insert(v["address"]);
    }
    // A vGPU type set on a VF is one the checkpoint records.
    for (const std::string& vf : vgpu_vfs_) {
      if (VgpuType(vf) != "0\n") {
        EXPECT_EQ(vgpus.count(vf), 1u) << "unrecorded vGPU on " << vf;
      }
    }
    for (const auto& [address, host] : *host_drivers_) {
      if (recorded.count(address) == 0) {
        EXPECT_EQ(Driver(address), host) << address;
      }
    }
    for (std::string file : CdiFiles()) {
      // A write cut short by a kill leaves ".<spec>.tmp-<n>": it belongs to <spec>, and goes when
      // the claim is unprepared (the end of each test checks that nothing is left).
      if (file.size() > 1 && file[0] == '.' && file.rfind(".tmp-") != std::string::npos) {
        file = file.substr(1, file.rfind(".tmp-") - 1);
      }
      EXPECT_EQ(files.count(file), 1u) << "CDI spec without a checkpoint entry: " << file;
    }
  }

  // One round of the SIGKILL tests on a fresh node: a daemon that is killed before step `k` of
  // its steps (the first `prepare_steps` are prepare's, the rest unprepare's) prepares and
  // unprepares `claim`; the kubelet's retry after the kill goes to a restarted daemon or to the
  // other instance. `prepared` checks the node between the two; at the end every function is
  // back on its host driver and nothing is left.
  void PrepareAndUnprepareThroughAKill(const SimClaim& claim, size_t k, size_t prepare_steps,
                                       bool retry_on_other_instance,
                                       const std::function<void()>& prepared) {
    if (retry_on_other_instance) StartSecondInstance();
    StartDaemon({"VFIO_DRA_SIM_CRASH_AT_STEP=" + std::to_string(k)});
    const auto retry_target = [&]() -> RegisteredPlugin& {
      EXPECT_EQ(daemon_->WaitForExit(std::chrono::seconds(10)), 128 + SIGKILL);
      if (retry_on_other_instance) return second_plugin_;
      StartDaemon();
      return plugin_;
    };
    const bool in_prepare = k <= prepare_steps;
    RegisteredPlugin* serving = &plugin_;
    auto first = sim_.Prepare(plugin_, {claim});
    if (in_prepare) {
      ASSERT_FALSE(first.ok()) << "the daemon should have died";
      serving = &retry_target();
      ExpectAccountedFor("after the kill");
      auto retried = sim_.Prepare(*serving, {claim});
      ASSERT_TRUE(retried.ok()) << retried.error().message;
      ASSERT_EQ(retried->claims().at(claim.uid).error(), "") << daemon_->Log();
    } else {
      ASSERT_TRUE(first.ok()) << first.error().message;
      ASSERT_EQ(first->claims().at(claim.uid).error(), "");
    }
    prepared();
    ExpectAccountedFor("prepared");

    auto unprepared = sim_.Unprepare(*serving, {claim});
    if (!in_prepare) {
      ASSERT_FALSE(unprepared.ok()) << "the daemon should have died";
      RegisteredPlugin& target = retry_target();
      ExpectAccountedFor("after the kill");
      unprepared = sim_.Unprepare(target, {claim});
    }
    ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
    ASSERT_EQ(unprepared->claims().at(claim.uid).error(), "") << daemon_->Log();
    for (const auto& [address, host] : *host_drivers_) {
      EXPECT_EQ(Driver(address), host) << address;
    }
    for (const std::string& vf : vgpu_vfs_) EXPECT_EQ(VgpuType(vf), "0\n") << vf;
    EXPECT_TRUE(CdiFiles().empty());
    EXPECT_TRUE(Checkpoint()["claims"].empty());
  }

  // PrepareAndUnprepareThroughAKill on a fresh node for each of `steps` (a clean run's, from
  // CleanRunSteps); `done` checks the node after each round.
  void KillAtEveryStep(
      const SimClaim& claim, const std::vector<std::string>& steps, bool retry_on_other_instance,
      const std::function<void()>& prepared, const std::function<void()>& done = [] {}) {
    size_t prepare_steps = 0;
    while (prepare_steps < steps.size() && steps[prepare_steps] != "cdi:remove") ++prepare_steps;
    for (size_t k = 1; k <= steps.size(); ++k) {
      SCOPED_TRACE("SIGKILL before step " + std::to_string(k) + " (" + steps[k - 1] + ")");
      FreshNode();
      PrepareAndUnprepareThroughAKill(claim, k, prepare_steps, retry_on_other_instance, prepared);
      done();
      if (::testing::Test::HasFailure()) break;
    }
  }
  // The steps of a clean prepare and unprepare of `claim`, as the daemon names them.
  std::vector<std::string> CleanRunSteps(const SimClaim& claim) {
    const std::string step_log = dir_ + "/steps.log";
    StartDaemon({"VFIO_DRA_SIM_STEP_LOG=" + step_log});
    EXPECT_EQ(sim_.Prepare(plugin_, {claim})->claims().at(claim.uid).error(), "") << daemon_->Log();
    EXPECT_EQ(sim_.Unprepare(plugin_, {claim})->claims().at(claim.uid).error(), "");
    std::vector<std::string> steps;
    std::ifstream in(step_log);
    for (std::string line; std::getline(in, line);) steps.push_back(line);
    return steps;
  }
  std::string VgpuType(const std::string& vf) const {
    return Slurp(dir_ + "/sys/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type");
  }

  std::string dir_, kubeconfig_;
  std::string fixture_ = "vm-host";
  // The functions the fixture's claims use, with their host drivers, and its vGPU VFs.
  const std::map<std::string, std::string>* host_drivers_ = &HostDrivers();
  std::vector<std::string> vgpu_vfs_;
  std::vector<std::string> every_instance_args_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<DaemonProcess> second_;
  KubeletSimulator sim_;
  RegisteredPlugin plugin_;
  RegisteredPlugin second_plugin_;
  int starts_ = 0;
};

TEST_F(PrepareDaemonTest, AClaimOfEachKindIsPreparedAndUnpreparedThroughTheKubelet) {
  struct Case {
    std::string name, uid, request, device;
    std::vector<std::string> bound;
  };
  const std::vector<Case> cases = {
      {"gpu",
       "11111111-0000-4000-8000-000000000001",
       "gpu",
       "gpu-0000-01-00-0",
       {"0000:01:00.0", "0000:01:00.1"}},
      {"nic", "11111111-0000-4000-8000-000000000002", "nic", "vf-0000-5e-02-1", {"0000:5e:02.1"}},
      {"disk",
       "11111111-0000-4000-8000-000000000003",
       "disk",
       "hostdev-0000-06-00-0",
       {"0000:06:00.0"}},
      {"vgpu",
       "11111111-0000-4000-8000-000000000004",
       "vgpu",
       "mdev-0000-3b-00-0-nvidia-222-0",
       {}}};
  for (const Case& c : cases) server_->PutClaim(Claim(c.name, c.uid, {{c.request, c.device}}));
  const std::string write_log = dir_ + "/writes.log";
  StartDaemon({"VFIO_DRA_SIM_WRITE_LOG=" + write_log});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto prepared = sim_.Prepare(plugin_, {{"vms", c.name, c.uid}});
    ASSERT_TRUE(prepared.ok()) << prepared.error().message;
    const auto& result = prepared->claims().at(c.uid);
    ASSERT_EQ(result.error(), "") << daemon_->Log();
    ASSERT_EQ(result.devices_size(), 1);
    const auto& device = result.devices(0);
    EXPECT_EQ(device.device_name(), c.device);
    EXPECT_EQ(device.pool_name(), "node1");
    ASSERT_EQ(device.cdi_device_ids_size(), 2);
    EXPECT_EQ(device.cdi_device_ids(0), std::string(kDriver) + "/vfio=" + c.uid + "-" + c.device);
    EXPECT_EQ(device.cdi_device_ids(1),
              std::string(kDriver) + "/metadata=" + c.uid + "_" + c.request);
    for (const std::string& f : c.bound) EXPECT_EQ(Driver(f), "vfio-pci") << f;
    EXPECT_TRUE(fs::exists(dir_ + "/cdi/vfio.dra.io-vfio_" + c.uid + ".json"));
    EXPECT_TRUE(
        fs::exists(dir_ + "/data/dra-device-metadata/" + c.uid + "_" + c.request + ".json"));
  }
  EXPECT_EQ(Driver("0000:3b:00.0"), "nvidia");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto unprepared = sim_.Unprepare(plugin_, {{"vms", c.name, c.uid}});
    ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
    EXPECT_EQ(unprepared->claims().at(c.uid).error(), "");
  }
  for (const auto& [address, host] : HostDrivers()) EXPECT_EQ(Driver(address), host) << address;
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_TRUE(Checkpoint()["claims"].empty());
  EXPECT_TRUE(fs::is_empty(dir_ + "/sys/bus/mdev/devices"));

  // Every sysfs write of the daemon went to an attribute of a managed function, to a driver's
  // bind/unbind with a managed function as the value, or to the vGPU type's create and the
  // instance's remove file.
  std::set<std::string> managed;
  for (const auto& [address, host] : HostDrivers()) managed.insert(address);
  const std::vector<SimWrite> writes = SimulatedKernel::ReadWriteLog(write_log);
  for (const SimWrite& w : writes) {
    EXPECT_TRUE(
        IsManagedWrite(w, managed, {"class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-222"}))
        << "write outside the managed devices: " << w.path << " <- " << w.value;
  }
  EXPECT_GT(writes.size(), 10u);
}

// The privilege check at start: an AppArmor-style denial of the mdev types' create files and no
// CAP_SYS_PTRACE give one warning each; the metrics show them; a claim of an mdev fails at once
// with the warning's text and no sysfs write, while a GPU (whose attributes are writable) is
// prepared.
TEST_F(PrepareDaemonTest, ServeWarnsOncePerMissingPrivilegeAndAClaimNeedingOneFailsWithIt) {
  const std::string vgpu_uid = "11111111-0000-4000-8000-000000000004";
  const std::string gpu_uid = "11111111-0000-4000-8000-000000000001";
  server_->PutClaim(Claim("vgpu", vgpu_uid, {{"vgpu", "mdev-0000-3b-00-0-nvidia-222-0"}}));
  server_->PutClaim(Claim("gpu", gpu_uid, {{"gpu", "gpu-0000-01-00-0"}}));
  std::ofstream(dir_ + "/status") << "CapEff:\t000001fffff7ffff\n";  // no CAP_SYS_PTRACE
  const std::string write_log = dir_ + "/writes.log";
  StartDaemon({"VFIO_DRA_SIM_WRITE_LOG=" + write_log,
               "VFIO_DRA_SIM_DENY_WRITES=class/mdev_bus:" + std::to_string(EACCES),
               "VFIO_DRA_SIM_PROCESS_STATUS=" + dir_ + "/status"});
  // The check runs on the first scan, before its devices are published.
  ASSERT_TRUE(server_->WaitForSlices([](const auto& s) { return s.size() >= 2; },
                                     std::chrono::seconds(20)));
  const std::string mdev_line_start =
      "privilege missing: write access to " + dir_ + "/sys/class/mdev_bus/0000:3b:00.0/";
  const std::string mdev_line_end =
      "/create for mediated devices (mdev create and remove): opening it for writing failed: "
      "Permission denied (errno 13); mount the host's /sys read-write and load the AppArmor "
      "profile deploy/apparmor/vfio-dra-plugin (or run Unconfined)";
  const std::string ptrace_line =
      "privilege missing: CAP_SYS_PTRACE for naming the processes that hold a busy device: the "
      "capability is not in the plugin's effective set (CapEff 000001fffff7ffff); /proc/<pid>/fd "
      "of other users' processes (KubeVirt's VMM runs as uid 107) cannot be read, so a busy "
      "device's holders may go unnamed; grant it with the Helm value deviceHolders.enabled=true "
      "(hostPID and SYS_PTRACE)";
  const std::string log = daemon_->Log();
  std::vector<std::string> warnings;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("privilege missing") != std::string::npos) warnings.push_back(line);
  }
  ASSERT_EQ(warnings.size(), 2u) << log;
  EXPECT_THAT(warnings[0], HasSubstr(" warning serve \"" + mdev_line_start));
  EXPECT_THAT(warnings[0], HasSubstr(mdev_line_end + "\" feature=mdev privilege=\"write access"));
  EXPECT_THAT(warnings[1], HasSubstr(" info serve \"" + ptrace_line +
                                     "\" feature=device-holders privilege=CAP_SYS_PTRACE"));

  httplib::Client http("127.0.0.1", MetricsPort());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("vfio_dra_privilege_missing{feature=\"device-holders\","
                                       "privilege=\"CAP_SYS_PTRACE\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("vfio_dra_privilege_missing{feature=\"mdev\""));

  auto refused = sim_.Prepare(plugin_, {{"vms", "vgpu", vgpu_uid}});
  ASSERT_TRUE(refused.ok()) << refused.error().message;
  const std::string error = refused->claims().at(vgpu_uid).error();
  EXPECT_THAT(error, HasSubstr("device mdev-0000-3b-00-0-nvidia-222-0 is not prepared: " +
                               mdev_line_start));
  EXPECT_THAT(error, HasSubstr(mdev_line_end));
  EXPECT_TRUE(SimulatedKernel::ReadWriteLog(write_log).empty());
  EXPECT_TRUE(fs::is_empty(dir_ + "/sys/bus/mdev/devices"));

  auto prepared = sim_.Prepare(plugin_, {{"vms", "gpu", gpu_uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(prepared->claims().at(gpu_uid).error(), "") << daemon_->Log();
  EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
  auto unprepared = sim_.Unprepare(plugin_, {{"vms", "gpu", gpu_uid}});
  ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
  EXPECT_EQ(unprepared->claims().at(gpu_uid).error(), "");
}

// With every privilege the node's devices need, serve logs no privilege line.
TEST_F(PrepareDaemonTest, ServeWarnsOfNoPrivilegeWhenNoneIsMissing) {
  std::ofstream(dir_ + "/status") << "CapEff:\t000001ffffffffff\n";
  StartDaemon({"VFIO_DRA_SIM_PROCESS_STATUS=" + dir_ + "/status"});
  ASSERT_TRUE(server_->WaitForSlices([](const auto& s) { return s.size() >= 2; },
                                     std::chrono::seconds(20)));
  const std::string log = daemon_->Log();
  EXPECT_THAT(log, HasSubstr("node devices"));  // the first scan, which the check follows
  EXPECT_THAT(log, ::testing::Not(HasSubstr("privilege missing"))) << log;
}

TEST_F(PrepareDaemonTest, AnUnbindThatHangsFailsOnlyThatClaimWithinTheDeadline) {
  server_->PutClaim(
      Claim("gpu", "11111111-0000-4000-8000-000000000001", {{"gpu", "gpu-0000-01-00-0"}}));
  server_->PutClaim(
      Claim("nic", "11111111-0000-4000-8000-000000000002", {{"nic", "vf-0000-5e-02-1"}}));
  StartDaemon({"VFIO_DRA_SIM_HANG_UNBIND=0000:01:00.1"});
  auto prepared = sim_.Prepare(plugin_, {{"vms", "gpu", "11111111-0000-4000-8000-000000000001"},
                                         {"vms", "nic", "11111111-0000-4000-8000-000000000002"}});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_THAT(prepared->claims().at("11111111-0000-4000-8000-000000000001").error(),
              HasSubstr("did not finish within 2000 ms"));
  EXPECT_EQ(prepared->claims().at("11111111-0000-4000-8000-000000000002").error(), "");
  EXPECT_EQ(Driver("0000:5e:02.1"), "vfio-pci");
}

// The value of one sample line of the Prometheus page ("name{labels} value"); -1 when absent.
double Sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

// The environment a process's program was started with (/proc/<pid>/environ), one entry each.
std::vector<std::string> StartingEnvironment(pid_t pid) {
  std::vector<std::string> entries;
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  for (std::string entry; std::getline(in, entry, '\0');) entries.push_back(entry);
  return entries;
}

TEST_F(PrepareDaemonTest, ServeRunsWithTheDeeperMallocThreadCacheUnlessTheOperatorChoseOne) {
  // Started without GLIBC_TUNABLES: the program running now was executed again with it.
  StartDaemon();
  EXPECT_THAT(StartingEnvironment(daemon_->pid()),
              ::testing::Contains("GLIBC_TUNABLES=glibc.malloc.tcache_count=" +
                                  std::to_string(cmd::kMallocThreadCacheCount)));
  EXPECT_THAT(daemon_->Log(), ::testing::Not(::testing::HasSubstr("malloc thread cache")));
  // An operator's choice stands as it is. (One tunable: glibc cuts the environment's copy of a
  // longer list at its colons as it reads it.)
  StartDaemon({"GLIBC_TUNABLES=glibc.malloc.tcache_count=7"});
  const std::vector<std::string> environment = StartingEnvironment(daemon_->pid());
  EXPECT_THAT(environment, ::testing::Contains("GLIBC_TUNABLES=glibc.malloc.tcache_count=7"));
  EXPECT_EQ(std::count_if(environment.begin(), environment.end(),
                          [](const std::string& e) { return e.rfind("GLIBC_TUNABLES=", 0) == 0; }),
            1);
}

TEST_F(PrepareDaemonTest, MetricsAndHealthFollowAPrepare) {
  const std::string uid = "11111111-0000-4000-8000-000000000001";
  server_->PutClaim(Claim("gpu", uid, {{"gpu", "gpu-0000-01-00-0"}}));
  StartDaemon();
  const int metrics_port = MetricsPort();
  ASSERT_GT(metrics_port, 0) << daemon_->Log();
  httplib::Client http("127.0.0.1", metrics_port);
  ASSERT_TRUE(server_->WaitForSlices([](const auto& s) { return s.size() >= 2; },
                                     std::chrono::seconds(20)));
  // Ready once the first slice sync has been recorded; poll the endpoint as a probe would.
  auto health = http.Get("/healthz");
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       health && health->status != 200 && std::chrono::steady_clock::now() < deadline;
       health = http.Get("/healthz")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << health->body;
  EXPECT_THAT(health->body, HasSubstr("kubelet registration: registered"));
  auto live = http.Get("/livez");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);

  auto before = http.Get("/metrics");
  ASSERT_TRUE(before);
  EXPECT_THAT(before->get_header_value("Content-Type"), HasSubstr("version=0.0.4"));
  EXPECT_EQ(Sample(before->body, R"(vfio_dra_published_devices{kind="gpu"})"), 2);
  EXPECT_EQ(Sample(before->body, R"(vfio_dra_published_devices{kind="vf"})"), 4);
  EXPECT_GE(Sample(before->body, R"(vfio_dra_slice_writes_total{operation="create"})"), 1);
  EXPECT_EQ(Sample(before->body, R"(vfio_dra_claims_total{operation="prepare",result="ok"})"), -1);

  auto prepared = sim_.Prepare(plugin_, {{"vms", "gpu", uid}});
  ASSERT_TRUE(prepared.ok());
  ASSERT_EQ(prepared->claims().at(uid).error(), "");
  auto after = http.Get("/metrics");
  ASSERT_TRUE(after);
  const std::string& page = after->body;
  EXPECT_EQ(Sample(page, R"(vfio_dra_requests_total{method="NodePrepareResources"})"), 1);
  EXPECT_EQ(Sample(page, R"(vfio_dra_claims_total{operation="prepare",result="ok"})"), 1);
  EXPECT_EQ(Sample(page, R"(vfio_dra_claim_duration_seconds_count{operation="prepare"})"), 1);
  EXPECT_EQ(Sample(page, R"(vfio_dra_device_operation_duration_seconds_count{operation="bind"})"),
            2);
  EXPECT_EQ(Sample(page, R"(vfio_dra_checkpoint_claims{state="PrepareCompleted"})"), 1);

  ASSERT_TRUE(sim_.Unprepare(plugin_, {{"vms", "gpu", uid}}).ok());
  auto done = http.Get("/metrics");
  ASSERT_TRUE(done);
  EXPECT_EQ(Sample(done->body, R"(vfio_dra_claims_total{operation="unprepare",result="ok"})"), 1);
  EXPECT_EQ(Sample(done->body,
                   R"(vfio_dra_device_operation_duration_seconds_count{operation="restore"})"),
            2);
  EXPECT_EQ(Sample(done->body, R"(vfio_dra_checkpoint_claims{state="PrepareCompleted"})"), 0);

  // A failing claim counts as an error.
  server_->PutClaim(
      Claim("bad", "11111111-0000-4000-8000-00000000000b", {{"gpu", "gpu-0000-09-00-0"}}));
  ASSERT_TRUE(sim_.Prepare(plugin_, {{"vms", "bad", "11111111-0000-4000-8000-00000000000b"}}).ok());
  auto failed = http.Get("/metrics");
  ASSERT_TRUE(failed);
  EXPECT_EQ(Sample(failed->body, R"(vfio_dra_claims_total{operation="prepare",result="error"})"),
            1);
  // Every family on the page was declared in the metric catalog: it has help text.
  std::istringstream lines(failed->body);
  std::set<std::string> typed, helped;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string hash, keyword, family;
    words >> hash >> keyword >> family;
    if (hash != "#") continue;
    (keyword == "TYPE" ? typed : helped).insert(family);
  }
  EXPECT_GE(typed.size(), 9u);
  EXPECT_EQ(typed, helped) << "a family recorded without a declaration in cmd/metric_catalog.cc";
  // The page as Prometheus parses it, and every family as the README's Metrics table lists it
  // (test/metrics/check_exposition.py, on Debian's python3 and its prometheus client).
  const std::string page_file = dir_ + "/metrics.txt";
  std::ofstream(page_file) << failed->body;
  const CommandResult parsed =
      RunCommand({VFIO_DRA_DEBIAN_PYTHON,
                  std::string(VFIO_DRA_SOURCE_DIR) + "/test/metrics/check_exposition.py",
                  std::string(VFIO_DRA_SOURCE_DIR) + "/README.md", page_file},
                 std::chrono::seconds(30));
  EXPECT_EQ(parsed.exit_code, 0) << parsed.output << failed->body;
}

// The kubelet's health stream over a prepare: every device healthy, then a prepared GPU function
// that left vfio-pci and a prepared VF that was hot-unplugged turn their devices UNHEALTHY with
// the reason, while the others stay HEALTHY.
TEST_F(PrepareDaemonTest, TheHealthStreamReportsPreparedDevicesThatBreak) {
  const std::string gpu_uid = "33333333-0000-4000-8000-000000000001";
  const std::string vf_uid = "33333333-0000-4000-8000-000000000002";
  server_->PutClaim(Claim("gpu", gpu_uid, {{"gpu", "gpu-0000-01-00-0"}}));
  server_->PutClaim(Claim("nic", vf_uid, {{"nic", "vf-0000-5e-02-1"}}));
  StartDaemon();
  ASSERT_EQ(sim_.Prepare(plugin_, {{"vms", "gpu", gpu_uid}})->claims().at(gpu_uid).error(), "");
  ASSERT_EQ(sim_.Prepare(plugin_, {{"vms", "nic", vf_uid}})->claims().at(vf_uid).error(), "");

  using Message = KubeletSimulator::HealthMessage;
  auto health_of = [](const Message& m, const std::string& device) -> const v1::DeviceHealth* {
    for (const auto& d : m.devices()) {
      if (d.device().device_name() == device) return &d;
    }
    return nullptr;
  };
  // The full list comes at once and again every --health-interval (1 s here), changed or not.
  auto first = sim_.WatchHealth(
      plugin_, [&](const Message& m) { return health_of(m, "gpu-0000-01-00-0") != nullptr; },
      std::chrono::seconds(20));
  ASSERT_TRUE(first.ok()) << first.error().message;
  int seen = 0;
  auto repeated = sim_.WatchHealth(
      plugin_, [&](const Message& m) { return m.devices_size() > 0 && ++seen == 2; },
      std::chrono::seconds(20));
  ASSERT_TRUE(repeated.ok()) << repeated.error().message;
  EXPECT_EQ(repeated->front().devices_size(), repeated->back().devices_size());
  for (const auto& d : first->back().devices()) {
    EXPECT_EQ(d.health(), v1::HEALTHY) << d.device().device_name() << ": " << d.message();
  }

  {
    // Another actor on the node: a function of the GPU is unbound, the VF is unplugged.
    SimulatedKernel kernel(dir_ + "/sys", dir_ + "/dev");
    ASSERT_EQ(kernel.Write(dir_ + "/sys/bus/pci/drivers/vfio-pci/unbind", "0000:01:00.1"), 0);
    kernel.RemoveDevice("0000:5e:02.1");
  }
  auto broken = sim_.WatchHealth(
      plugin_,
      [&](const Message& m) {
        const auto* gpu = health_of(m, "gpu-0000-01-00-0");
        const auto* vf = health_of(m, "vf-0000-5e-02-1");
        return gpu != nullptr && vf != nullptr && gpu->health() == v1::UNHEALTHY &&
               vf->health() == v1::UNHEALTHY;
      },
      std::chrono::seconds(20));
  ASSERT_TRUE(broken.ok()) << broken.error().message << daemon_->Log();
  const Message& last = broken->back();
  EXPECT_THAT(health_of(last, "gpu-0000-01-00-0")->message(),
              HasSubstr("0000:01:00.1 prepared for claim vms/gpu has no driver"));
  EXPECT_THAT(health_of(last, "vf-0000-5e-02-1")->message(),
              HasSubstr("PCI function 0000:5e:02.1 is gone"));
  const auto* other_vf = health_of(last, "vf-0000-5e-02-0");
  ASSERT_NE(other_vf, nullptr);
  EXPECT_EQ(other_vf->health(), v1::HEALTHY);
  EXPECT_THAT(daemon_->Log(), HasSubstr("device unhealthy"));
}

// Device taints (issue 45) through the daemon: the node changes the way the kernel (or an admin)
// would, and the next check (--rescan-interval 1) publishes the taint and the health stream says
// the same; both clear once the cause goes.
using HealthMessage = KubeletSimulator::HealthMessage;

// `name` as node1's slices list it (v1's flat fields, or v1beta1's basic); null when none does.
json PublishedDevice(const std::vector<json>& slices, const std::string& name) {
  for (const json& slice : slices) {
    for (const json& device : slice["spec"].value("devices", json::array())) {
      if (device.value("name", "") == name)
        return device.contains("basic") ? device["basic"] : device;
    }
  }
  return nullptr;
}

// The device's taint keyed `key`; null when it has none.
json TaintOf(const json& device, const std::string& key) {
  for (const json& taint : device.value("taints", json::array())) {
    if (taint.value("key", "") == key) return taint;
  }
  return nullptr;
}

const v1::DeviceHealth* HealthOf(const HealthMessage& m, const std::string& device) {
  for (const auto& d : m.devices()) {
    if (d.device().device_name() == device) return &d;
  }
  return nullptr;
}

struct TaintCase {
  std::string device;
  std::string cause, value, effect;  // the taint is keyed vfio.dra.io/<cause>
  std::string reason;                // what the health stream's message holds
  std::function<void()> start, end;  // make the cause, take it away
};

class DeviceTaintTest : public PrepareDaemonTest {
 protected:
  void SetUp() override {
    PrepareDaemonTest::SetUp();
    every_instance_args_ = {"--rescan-interval", "1"};
    // The GPU counts PCIe errors (AER) from the start, as the kernel gives a capable function its
    // counters when it adds it; the periodic check reads those of the functions that have them.
    std::ofstream(Devices() + "0000:01:00.0/aer_dev_fatal") << "Undefined 0\nTOTAL_ERR_FATAL 0\n";
  }
  std::string Devices() const { return dir_ + "/sys/bus/pci/devices/"; }
  // Waits for the device to be published with (or without) the case's taint; the published
  // taint (null when untainted), or nothing when the wait timed out.
  std::optional<json> WaitForTaint(const TaintCase& c, bool tainted) {
    json found;
    const std::string key = std::string(kDriver) + "/" + c.cause;
    const bool seen = server_->WaitForSlices(
        [&](const std::vector<json>& slices) {
          const json device = PublishedDevice(slices, c.device);
          if (device.is_null()) return false;
          found = TaintOf(device, key);
          return found.is_null() != tainted;
        },
        std::chrono::seconds(30));
    if (!seen) return std::nullopt;
    return found;
  }
  // Waits for the health stream to report the device with `health` and a message that holds
  // the case's reason once (or, without `with_reason`, does not hold it).
  void ExpectHealth(const TaintCase& c, v1::HealthStatus health, bool with_reason) {
    auto watched = sim_.WatchHealth(
        plugin_,
        [&](const HealthMessage& m) {
          const auto* d = HealthOf(m, c.device);
          if (d == nullptr || d->health() != health) return false;
          const size_t at = d->message().find(c.reason);
          if (!with_reason) return at == std::string::npos;
          return at != std::string::npos &&
                 d->message().find(c.reason, at + 1) == std::string::npos;
        },
        std::chrono::seconds(30));
    ASSERT_TRUE(watched.ok()) << c.device << ": " << watched.error().message << daemon_->Log();
  }
  // The case's taint appears in the slice and the health stream, and both clear once it ends.
  void ExpectTaintComesAndGoes(const TaintCase& c) {
    SCOPED_TRACE(c.cause + " on " + c.device);
    ASSERT_TRUE(WaitForTaint(c, false).has_value()) << daemon_->Log();
    c.start();
    const std::optional<json> tainted = WaitForTaint(c, true);
    ASSERT_TRUE(tainted.has_value())
        << PublishedDevice(server_->Slices(), c.device).dump() << daemon_->Log();
    const json& taint = *tainted;
    EXPECT_EQ(taint.value("value", ""), c.value);
    EXPECT_EQ(taint.value("effect", ""), c.effect);
    EXPECT_THAT(taint.value("timeAdded", ""),
                ::testing::MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z"));
    ExpectHealth(c, c.effect == "NoSchedule" ? v1::UNHEALTHY : v1::HEALTHY, true);

    c.end();
    ASSERT_TRUE(WaitForTaint(c, false).has_value())
        << PublishedDevice(server_->Slices(), c.device).dump() << daemon_->Log();
    ExpectHealth(c, v1::HEALTHY, false);
  }
};

TEST_F(DeviceTaintTest, AerFatalUnreadableAerAndPfLinkDownTaintAndClear) {
  StartDaemon();
  const std::string aer = Devices() + "0000:01:00.0/aer_dev_fatal";
  const std::string operstate = Devices() + "0000:5e:00.0/net/ens1f0/operstate";
  const auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  };
  ExpectTaintComesAndGoes({"gpu-0000-01-00-0", "unhealthy", "aer-fatal", "NoSchedule",
                           "PCI function 0000:01:00.0 has counted 1 fatal PCIe error(s)",
                           [&] { write(aer, "Undefined 0\nDLP 1\nSDES 0\nTOTAL_ERR_FATAL 1\n"); },
                           [&] { write(aer, "Undefined 0\nDLP 0\nSDES 0\nTOTAL_ERR_FATAL 0\n"); }});
  ExpectTaintComesAndGoes({"gpu-0000-01-00-0", "unmonitored", "aer-unreadable", "None",
                           "cannot monitor PCI function 0000:01:00.0",
                           [&] { write(aer, "Undefined 0\nTOTAL_ERR_FATAL many\n"); },
                           [&] { write(aer, "Undefined 0\nTOTAL_ERR_FATAL 0\n"); }});
  // The PF's link is down: each of its VFs passes no traffic, but may still be given out.
  ExpectTaintComesAndGoes({"vf-0000-5e-02-1", "degraded", "pf-link-down", "None",
                           "the link of PF 0000:5e:00.0 (ens1f0) is down",
                           [&] { write(operstate, "down\n"); }, [&] { write(operstate, "up\n"); }});
}

// A VF that a prepared claim holds goes with its PF's sriov_numvfs: it stays published, tainted
// lost, until the claim is unprepared; then it is dropped and nothing of the claim is left.
TEST_F(DeviceTaintTest, AHeldVfThatGoesStaysTaintedLostUntilItsClaimIsUnprepared) {
  const std::string uid = "44444444-0000-4000-8000-000000000001";
  server_->PutClaim(Claim("nic", uid, {{"nic", "vf-0000-5e-02-1"}}));
  StartDaemon();
  ASSERT_EQ(sim_.Prepare(plugin_, {{"vms", "nic", uid}})->claims().at(uid).error(), "");
  const TaintCase lost{"vf-0000-5e-02-1", "lost", "vf-removed", "NoSchedule", "is gone", {}, {}};
  ASSERT_TRUE(WaitForTaint(lost, false).has_value()) << daemon_->Log();
  {
    SimulatedKernel kernel(dir_ + "/sys", dir_ + "/dev");
    ASSERT_EQ(kernel.Write(Devices() + "0000:5e:00.0/sriov_numvfs", "0"), 0);
  }
  const std::optional<json> tainted = WaitForTaint(lost, true);
  ASSERT_TRUE(tainted.has_value()) << daemon_->Log();
  const json& taint = *tainted;
  EXPECT_EQ(taint.value("value", ""), "vf-removed");
  EXPECT_EQ(taint.value("effect", ""), "NoSchedule");
  EXPECT_FALSE(taint.value("timeAdded", "").empty());
  const std::vector<json> slices = server_->Slices();
  EXPECT_FALSE(PublishedDevice(slices, "vf-0000-5e-02-1").contains("consumesCounters"));
  EXPECT_TRUE(PublishedDevice(slices, "vf-0000-5e-02-0").is_null()) << "no claim holds it";
  ExpectHealth(lost, v1::UNHEALTHY, true);

  auto unprepared = sim_.Unprepare(plugin_, {{"vms", "nic", uid}});
  ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
  EXPECT_EQ(unprepared->claims().at(uid).error(), "") << daemon_->Log();
  EXPECT_TRUE(server_->WaitForSlices(
      [](const std::vector<json>& s) { return PublishedDevice(s, "vf-0000-5e-02-1").is_null(); },
      std::chrono::seconds(30)))
      << daemon_->Log();
  EXPECT_TRUE(CdiFiles().empty());
  EXPECT_TRUE(Checkpoint()["claims"].empty()) << Checkpoint().dump();
}

// Issue 57 (the hour soak, seed 479803486): the plugin is killed, the kubelet deletes the node's
// slices as it unregisters it, and then the function a prepared claim holds is hot-removed. The
// next instance finds nothing on the server to keep the device from: it publishes it from the
// claim's record, tainted lost, until the claim is unprepared.
TEST_F(DeviceTaintTest, AHeldFunctionRemovedWhileNoInstanceRanIsPublishedTaintedLostFromItsRecord) {
  const std::string uid = "44444444-0000-4000-8000-000000000004";
  const std::string nvme = "0000:06:00.0";
  server_->PutClaim(Claim("disk", uid, {{"disk", "hostdev-0000-06-00-0"}}));
  StartDaemon();
  ASSERT_EQ(sim_.Prepare(plugin_, {{"vms", "disk", uid}})->claims().at(uid).error(), "")
      << daemon_->Log();
  const TaintCase lost{"hostdev-0000-06-00-0", "lost", "removed", "NoSchedule", "is gone", {}, {}};
  ASSERT_TRUE(WaitForTaint(lost, false).has_value()) << daemon_->Log();
  daemon_.reset();                                    // killed
  server_->DeleteSlicesWhere("spec.nodeName=node1");  // the kubelet unregisters it
  {
    SimulatedKernel kernel(dir_ + "/sys", dir_ + "/dev");
    kernel.RemoveDevice(nvme);
  }
  ASSERT_FALSE(fs::exists(Devices() + nvme));

  StartDaemon();
  const std::optional<json> tainted = WaitForTaint(lost, true);
  ASSERT_TRUE(tainted.has_value()) << server_->Slices().size() << " slices" << daemon_->Log();
  EXPECT_EQ(tainted->value("value", ""), "removed");
  EXPECT_EQ(tainted->value("effect", ""), "NoSchedule");
  const json device = PublishedDevice(server_->Slices(), "hostdev-0000-06-00-0");
  EXPECT_EQ(device["attributes"]["resource.kubernetes.io/pciBusID"], json({{"string", nvme}}))
      << device.dump();
  EXPECT_FALSE(device.contains("consumesCounters"));
  EXPECT_FALSE(device.contains("capacity"));
  ExpectHealth(lost, v1::UNHEALTHY, true);

  auto unprepared = sim_.Unprepare(plugin_, {{"vms", "disk", uid}});
  ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
  EXPECT_EQ(unprepared->claims().at(uid).error(), "") << daemon_->Log();
  EXPECT_TRUE(server_->WaitForSlices(
      [](const std::vector<json>& s) {
        return !s.empty() && PublishedDevice(s, "hostdev-0000-06-00-0").is_null();
      },
      std::chrono::seconds(30)))
      << daemon_->Log();
  EXPECT_TRUE(Checkpoint()["claims"].empty()) << Checkpoint().dump();
}

// Issue 53 item 9: a function a prepared claim holds is bound to a third driver (taint
// unhealthy/driver-changed); the unprepare leaves it there, and so changes nothing the periodic
// probe reads (no driver list, no mdev, no AER count). The unprepare itself must have the node
// re-evaluated: the taint goes within seconds, not at the next full rescan (10 minutes).
TEST_F(DeviceTaintTest, ADriverChangedTaintGoesWhenItsClaimIsUnprepared) {
  const std::string uid = "44444444-0000-4000-8000-000000000003";
  const std::string nvme = "0000:06:00.0";
  server_->PutClaim(Claim("disk", uid, {{"disk", "hostdev-0000-06-00-0"}}));
  StartDaemon();
  ASSERT_EQ(sim_.Prepare(plugin_, {{"vms", "disk", uid}})->claims().at(uid).error(), "")
      << daemon_->Log();
  ASSERT_EQ(Driver(nvme), "vfio-pci");
  const TaintCase changed{"hostdev-0000-06-00-0",
                          "unhealthy",
                          "driver-changed",
                          "NoSchedule",
                          "was bound to uio_pci_generic outside vfio-dra",
                          {},
                          {}};
  ASSERT_TRUE(WaitForTaint(changed, false).has_value()) << daemon_->Log();
  // Someone moves the function from vfio-pci to uio_pci_generic, which the simulated kernel does
  // not bind by itself: the links are made as the kernel would make them.
  {
    SimulatedKernel kernel(dir_ + "/sys", dir_ + "/dev");
    ASSERT_EQ(kernel.Write(dir_ + "/sys/bus/pci/drivers/vfio-pci/unbind", nvme), 0);
  }
  const std::string sys = dir_ + "/sys";
  const std::string device_dir =
      fs::relative(fs::canonical(sys + "/bus/pci/devices/" + nvme), fs::canonical(sys));
  const SysfsFixture fixture(sys);
  fixture.WriteFile("bus/pci/drivers/uio_pci_generic/bind", "");
  fixture.Symlink(device_dir + "/driver", "bus/pci/drivers/uio_pci_generic");
  fixture.Symlink("bus/pci/drivers/uio_pci_generic/" + nvme, device_dir);
  ASSERT_EQ(Driver(nvme), "uio_pci_generic");
  const std::optional<json> tainted = WaitForTaint(changed, true);
  ASSERT_TRUE(tainted.has_value()) << daemon_->Log();
  EXPECT_EQ(tainted->value("value", ""), "driver-changed");
  ExpectHealth(changed, v1::UNHEALTHY, true);

  auto unprepared = sim_.Unprepare(plugin_, {{"vms", "disk", uid}});
  ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
  EXPECT_EQ(unprepared->claims().at(uid).error(), "") << daemon_->Log();
  EXPECT_TRUE(Checkpoint()["claims"].empty()) << Checkpoint().dump();
  EXPECT_EQ(Driver(nvme), "uio_pci_generic") << "the unprepare left the function where it was";
  // WaitForTaint waits up to 30 s, far below the 10 minutes of the full rescan.
  ASSERT_TRUE(WaitForTaint(changed, false).has_value())
      << PublishedDevice(server_->Slices(), changed.device).dump() << daemon_->Log();
  ExpectHealth(changed, v1::HEALTHY, false);
}

// Issue 58: a claim prepared and unprepared changes nothing that is published (its VF is shown on
// its driver from before), so it costs no slice sync, no slice write and no rescan of the node:
// each was a rebuild of the whole pool or a scan of every function, per claim.
TEST_F(DeviceTaintTest, AClaimPreparedAndUnpreparedSyncsNoSliceAndRescansNothing) {
  const std::string uid = "44444444-0000-4000-8000-000000000005";
  server_->PutClaim(Claim("nic", uid, {{"nic", "vf-0000-5e-02-1"}}));
  StartDaemon();
  const int port = MetricsPort();
  ASSERT_GT(port, 0) << daemon_->Log();
  httplib::Client http("127.0.0.1", port);
  // The page once `more` periodic checks (one a second here) have run after `page`'s: a rescan
  // asked for before then has run by then (it is due 200 ms after it is asked for, and a due
  // rescan goes before a check). Empty after 30 s.
  const auto after_checks = [&](const std::string& page, int more) {
    const double from = Sample(page, "vfio_dra_device_checks_total");
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
         std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
      auto now = http.Get("/metrics");
      if (now && Sample(now->body, "vfio_dra_device_checks_total") >= from + more) return now->body;
    }
    return std::string();
  };
  ASSERT_TRUE(
      server_->WaitForSlices([](const auto& s) { return !s.empty(); }, std::chrono::seconds(20)));
  auto first = http.Get("/metrics");
  ASSERT_TRUE(first);
  const std::string before = after_checks(first->body, 2);
  ASSERT_FALSE(before.empty()) << daemon_->Log();
  for (int i = 0; i < 3; ++i) {
    auto prepared = sim_.Prepare(plugin_, {{"vms", "nic", uid}});
    ASSERT_TRUE(prepared.ok()) << prepared.error().message;
    ASSERT_EQ(prepared->claims().at(uid).error(), "") << daemon_->Log();
    ASSERT_EQ(Driver("0000:5e:02.1"), "vfio-pci");
    auto unprepared = sim_.Unprepare(plugin_, {{"vms", "nic", uid}});
    ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
    ASSERT_EQ(unprepared->claims().at(uid).error(), "") << daemon_->Log();
  }
  auto done = http.Get("/metrics");
  ASSERT_TRUE(done);
  const std::string after = after_checks(done->body, 2);
  ASSERT_FALSE(after.empty()) << daemon_->Log();
  for (const char* series : {R"(vfio_dra_slice_syncs_total{result="ok"})",
                             R"(vfio_dra_slice_syncs_total{result="error"})",
                             R"(vfio_dra_slice_writes_total{operation="create"})",
                             R"(vfio_dra_slice_writes_total{operation="update"})",
                             R"(vfio_dra_slice_writes_total{operation="delete"})",
                             R"(vfio_dra_device_scans_total{cause="event"})"}) {
    EXPECT_EQ(Sample(after, series), Sample(before, series)) << series;
  }
}

// The GPU's IOMMU group holds a USB controller no driver had; once the host binds it, the
// published GPU stays published, tainted group-unsafe, and a prepare of it is refused with the
// reason; unbound again, the taint goes and the GPU can be prepared.
TEST_F(DeviceTaintTest, AGroupThatGainsAHostFunctionTaintsItsDeviceAndRefusesItsPrepare) {
  PciSpec usb = MakePciSpec("0000:01:01.0", 0x1b21, 0x2142, 0x0c0330, "xhci_hcd", 10, 0);
  SysfsFixture(dir_ + "/sys").AddPci(usb);
  const std::string xhci = dir_ + "/sys/bus/pci/drivers/xhci_hcd/";
  // The simulated kernel records xhci_hcd as the function's host driver on its first use.
  ASSERT_EQ(SimulatedKernel(dir_ + "/sys", dir_ + "/dev").Write(xhci + "unbind", "0000:01:01.0"),
            0);
  const std::string uid = "44444444-0000-4000-8000-000000000002";
  server_->PutClaim(Claim("gpu", uid, {{"gpu", "gpu-0000-01-00-0"}}));
  StartDaemon();
  const TaintCase unsafe{"gpu-0000-01-00-0",
                         "group-unsafe",
                         "host-function-in-group",
                         "NoSchedule",
                         "0000:01:01.0",
                         {},
                         {}};
  ASSERT_TRUE(WaitForTaint(unsafe, false).has_value()) << daemon_->Log();
  ASSERT_EQ(SimulatedKernel(dir_ + "/sys", dir_ + "/dev").Write(xhci + "bind", "0000:01:01.0"), 0);
  const std::optional<json> tainted = WaitForTaint(unsafe, true);
  ASSERT_TRUE(tainted.has_value()) << daemon_->Log();
  const json& taint = *tainted;
  EXPECT_EQ(taint.value("value", ""), "host-function-in-group");
  EXPECT_EQ(taint.value("effect", ""), "NoSchedule");
  EXPECT_FALSE(taint.value("timeAdded", "").empty());
  ExpectHealth(unsafe, v1::UNHEALTHY, true);

  auto refused = sim_.Prepare(plugin_, {{"vms", "gpu", uid}});
  ASSERT_TRUE(refused.ok()) << refused.error().message;
  EXPECT_THAT(refused->claims().at(uid).error(),
              HasSubstr("is tainted vfio.dra.io/group-unsafe: its IOMMU group holds a function "
                        "the host uses"));
  EXPECT_EQ(Driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(Driver("0000:01:01.0"), "xhci_hcd");

  ASSERT_EQ(SimulatedKernel(dir_ + "/sys", dir_ + "/dev").Write(xhci + "unbind", "0000:01:01.0"),
            0);
  ASSERT_TRUE(WaitForTaint(unsafe, false).has_value()) << daemon_->Log();
  ExpectHealth(unsafe, v1::HEALTHY, false);
  EXPECT_EQ(sim_.Prepare(plugin_, {{"vms", "gpu", uid}})->claims().at(uid).error(), "");
  EXPECT_EQ(sim_.Unprepare(plugin_, {{"vms", "gpu", uid}})->claims().at(uid).error(), "");
  EXPECT_TRUE(Checkpoint()["claims"].empty());
}

// The API server misbehaves the whole time (dropped connections, 500s, 429 with Retry-After,
// 409 on slice writes, watches that open with 410, slow answers, and halfway a token that expires
// and is rotated on disk) while pods come and go and someone deletes the node's slices. Every
// prepare and unprepare must happen exactly once on the node (the kubelet retries failed calls as
// it does), and once the server behaves the slices must converge to what the node has.
TEST_F(PrepareDaemonTest, SoakUnderApiFaultsLosesAndDoublesNothingAndSlicesConverge) {
  const std::string token_file = dir_ + "/token";
  std::ofstream(token_file) << "token-1\n";
  server_->SetToken("token-1");
  kubeconfig_ = server_->WriteKubeconfig(dir_, token_file);
  FaultMix mix;
  mix.drop = 0.08;
  mix.server_error = 0.08;
  mix.throttle = 0.04;
  mix.conflict = 0.2;
  mix.watch_expired = 0.3;
  mix.slow = 0.05;
  mix.seed = 20261122;
  server_->SetFaultMix(mix);
  const std::string write_log = dir_ + "/writes.log";
  StartDaemon({"VFIO_DRA_SIM_WRITE_LOG=" + write_log});

  struct Pod {
    std::string request, device;
    std::vector<std::string> functions;  // bound to vfio-pci for it
  };
  const std::vector<Pod> pods = {{"gpu", "gpu-0000-01-00-0", {"0000:01:00.0", "0000:01:00.1"}},
                                 {"nic", "vf-0000-5e-02-1", {"0000:5e:02.1"}},
                                 {"disk", "hostdev-0000-06-00-0", {"0000:06:00.0"}},
                                 {"vgpu", "mdev-0000-3b-00-0-nvidia-222-0", {}}};
  // The kubelet repeats a failed call until it succeeds; so does this. The bound only keeps a
  // broken daemon from hanging the suite: it is far above what a loaded 2-core machine under ASan
  // needs (a call gives up at the kubelet's deadline, and fault retries back off for seconds).
  auto until_ok = [&](auto call, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    std::string last;
    while (std::chrono::steady_clock::now() < deadline) {
      auto response = call();
      if (!response.ok()) {
        last = response.error().message;
        continue;
      }
      const std::string error = response->claims().begin()->second.error();
      if (error.empty()) return true;
      last = error;
    }
    ADD_FAILURE() << what << " did not succeed within 5 minutes; last error: " << last;
    return false;
  };
  constexpr int kCycles = 15;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    if (cycle == kCycles / 2) {
      // The token expires: the server wants the new one, which the kubelet writes to the file.
      server_->SetToken("token-2");
      std::ofstream(token_file) << "token-2\n";
    }
    std::vector<SimClaim> claims;
    for (size_t i = 0; i < pods.size(); ++i) {
      const std::string uid = "55555555-0000-4000-8000-" + std::string(10, '0') +
                              std::to_string(cycle) + std::to_string(i);
      const std::string name = pods[i].request + "-" + std::to_string(cycle);
      server_->PutClaim(Claim(name, uid, {{pods[i].request, pods[i].device}}));
      claims.push_back({"vms", name, uid});
    }
    for (const SimClaim& claim : claims) {
      ASSERT_TRUE(until_ok([&] { return sim_.Prepare(plugin_, {claim}); }, "prepare " + claim.name))
          << daemon_->Log();
    }
    server_->DeleteSlicesWhere("spec.nodeName=node1");  // as a restarting kubelet does
    for (const SimClaim& claim : claims) {
      ASSERT_TRUE(
          until_ok([&] { return sim_.Unprepare(plugin_, {claim}); }, "unprepare " + claim.name))
          << daemon_->Log();
      server_->RemoveClaim(claim.namespace_, claim.name);  // the pod and its claim are gone
    }
    const std::vector<json> slices = server_->Slices();
    if (!slices.empty()) server_->RemoveSlice(slices.front()["metadata"]["name"]);
  }

  // Nothing doubled, nothing lost: each cycle bound each function once and created and removed
  // the vGPU once, and everything is back where it was.
  std::map<std::string, int> binds;
  int creates = 0, removes = 0;
  for (const SimWrite& w : SimulatedKernel::ReadWriteLog(write_log)) {
    if (w.path == "bus/pci/drivers/vfio-pci/bind") binds[w.value] += 1;
    if (w.path.ends_with("/create")) ++creates;
    if (w.path.ends_with("/remove")) ++removes;
  }
  for (const Pod& pod : pods) {
    for (const std::string& f : pod.functions) EXPECT_EQ(binds[f], kCycles) << f;
  }
  EXPECT_EQ(creates, kCycles);
  EXPECT_EQ(removes, kCycles);
  for (const auto& [address, host] : HostDrivers()) EXPECT_EQ(Driver(address), host) << address;
  EXPECT_TRUE(Checkpoint()["claims"].empty());
  EXPECT_TRUE(CdiFiles().empty());

  // The faults really happened.
  const InjectedFaults injected = server_->Injected();
  std::cout << "injected faults: drop=" << injected.drop << " 500=" << injected.server_error
            << " 429=" << injected.throttle << " 409=" << injected.conflict
            << " watch-410=" << injected.watch_expired << " slow=" << injected.slow << " of "
            << server_->Requests().size() << " requests\n";
  EXPECT_GT(injected.drop, 0);
  EXPECT_GT(injected.server_error, 0);
  EXPECT_GT(injected.conflict, 0);
  EXPECT_GT(injected.watch_expired, 0);
  size_t with_new_token = 0;
  for (const RecordedRequest& r : server_->Requests()) {
    with_new_token += r.authorization == "Bearer token-2" ? 1 : 0;
  }
  EXPECT_GT(with_new_token, 0u) << "the rotated token was never used";

  // A quiet server: the slices converge to exactly the node's devices, in one consistent pool.
  server_->SetFaultMix(FaultMix{});
  sysfs::SysfsReader sysfs(dir_ + "/sys");
  auto policy = discovery::LoadAdminPolicy(dir_ + "/policy.yaml");
  ASSERT_TRUE(policy.ok());
  auto scan = discovery::ScanNode(sysfs, nullptr, *policy);
  slicepublisher::MdevTypeMaxima capacity;
  capacity.Observe(scan->inventory);
  const auto desired = slicepublisher::BuildDesiredPool(
      *scan, {"node1", slicepublisher::CounterLayout::kOwnSlice}, capacity);
  std::multiset<std::string> expected;
  for (const auto& slice : desired.slices) {
    for (const auto& device : slice.devices) expected.insert(device.name);
  }
  ASSERT_FALSE(expected.empty());
  auto converged = [&](const std::vector<json>& slices) {
    std::multiset<std::string> names;
    std::set<long long> generations;
    for (const json& slice : slices) {
      if (slice["spec"]["pool"]["resourceSliceCount"] != slices.size()) return false;
      generations.insert(slice["spec"]["pool"]["generation"].get<long long>());
      for (const json& device : slice["spec"].value("devices", json::array())) {
        names.insert(device["name"].get<std::string>());
      }
    }
    return generations.size() == 1 && names == expected;
  };
  // Generous for the same reason: the reconciler paces itself (5 QPS) and backs off after faults.
  EXPECT_TRUE(server_->WaitForSlices(converged, std::chrono::minutes(3)))
      << daemon_->Log() << "\nslices: " << json(server_->Slices()).dump(1);
}

class VgpuLayoutDaemonTest : public PrepareDaemonTest {
 protected:
  // The vgpu-vf fixture with a policy that declares the layout of GPU 0000:41:00.0.
  void VgpuVfNodeWithLayout(const std::string& type, const std::string& count) {
    fixture_ = "vgpu-vf";
    FreshNode();
    std::ofstream(dir_ + "/policy.yaml")
        << "version: v1\nvgpuLayouts:\n  - match: {address: \"0000:41:00.0\"}\n    vgpuType: \""
        << type << "\"\n    count: " << count << "\n";
  }
};

// A declared vGPU layout (#53): the daemon makes its vGPUs at start, before the first publish, and
// publishes each as an existing vGPU (no counters: allocatable once). Killed between two of its
// writes, the restarted daemon tops the GPU up. A claim of one is handed it and gives it back in
// place.
TEST_F(VgpuLayoutDaemonTest, IsMadeAtStartToppedUpAfterAKillAndKeptByClaims) {
  VgpuVfNodeWithLayout("NVIDIA H100-20C", "3");
  // Killed before its second write.
  LaunchInstance({"VFIO_DRA_SIM_CRASH_AT_STEP=2"}, "registry", {}, daemon_);
  ASSERT_EQ(daemon_->WaitForExit(std::chrono::seconds(30)), 128 + SIGKILL) << daemon_->Log();
  EXPECT_EQ(VgpuType("0000:41:00.4"), "1414\n");
  EXPECT_EQ(VgpuType("0000:41:00.5"), "0\n");

  StartDaemon();
  const auto published = [](const std::vector<json>& slices) {
    for (const char* name :
         {"vgpu-0000-41-00-4-1414", "vgpu-0000-41-00-5-1414", "vgpu-0000-41-00-6-1414"}) {
      const json device = PublishedDevice(slices, name);
      if (device.is_null() || device.contains("consumesCounters")) return false;
    }
    return true;
  };
  ASSERT_TRUE(server_->WaitForSlices(published, std::chrono::seconds(30))) << daemon_->Log();
  EXPECT_EQ(VgpuType("0000:41:00.6"), "1414\n");
  EXPECT_EQ(VgpuType("0000:41:00.7"), "0\n") << "the count is 3";
  EXPECT_EQ(VgpuType("0000:c1:00.5"), "0\n") << "no layout for that GPU";

  const std::string uid = "22222222-0000-4000-8000-000000000053";
  server_->PutClaim(Claim("vm", uid, {{"vgpu", "vgpu-0000-41-00-5-1414"}}));
  auto prepared = sim_.Prepare(plugin_, {{"vms", "vm", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_EQ(prepared->claims().at(uid).error(), "") << daemon_->Log();
  auto unprepared = sim_.Unprepare(plugin_, {{"vms", "vm", uid}});
  ASSERT_TRUE(unprepared.ok()) << unprepared.error().message;
  ASSERT_EQ(unprepared->claims().at(uid).error(), "") << daemon_->Log();
  EXPECT_EQ(VgpuType("0000:41:00.5"), "1414\n") << "left in place for the next claim";
  EXPECT_TRUE(Checkpoint()["claims"].empty());
  EXPECT_TRUE(CdiFiles().empty());
}

// A call that holds the GPU's device lock when the daemon starts: the layout waits, the devices are
// published meanwhile, and once the lock is free a periodic check (although no device changed)
// makes and publishes the vGPUs.
TEST_F(VgpuLayoutDaemonTest, WhoseGpuIsLockedIsMadeOnceTheLockIsFree) {
  VgpuVfNodeWithLayout("1416", "max");
  fs::create_directories(dir_ + "/data/devices");
  auto held = FileLock::TryAcquire(dir_ + "/data/devices/0000:41:00.0.lock", LockMode::kExclusive);
  ASSERT_TRUE(held.ok() && held->has_value());
  StartInstance({}, "registry", {"--rescan-interval", "1"}, daemon_, plugin_);
  ASSERT_TRUE(server_->WaitForSlices(
      [](const std::vector<json>& s) {
        return !PublishedDevice(s, "vgpu-0000-c1-00-4-1415").is_null();
      },
      std::chrono::seconds(30)))
      << daemon_->Log();
  EXPECT_EQ(VgpuType("0000:41:00.4"), "0\n") << "the lock is held";
  held->reset();
  ASSERT_TRUE(server_->WaitForSlices(
      [](const std::vector<json>& s) {
        const json device = PublishedDevice(s, "vgpu-0000-41-00-4-1416");
        return !device.is_null() && !device.contains("consumesCounters");
      },
      std::chrono::seconds(30)))
      << daemon_->Log();
  EXPECT_EQ(VgpuType("0000:41:00.4"), "1416\n");
  EXPECT_EQ(VgpuType("0000:41:00.5"), "0\n") << "the GPU holds one 80C";
}

// Kills the daemon before each step (1-based) of preparing and then unpreparing a claim with a
// GPU (two functions) and a vGPU, and checks the outcome after the retry. The retry goes to the
// restarted daemon, or (a rolling update) to the other instance, which was running all along and
// so never ran its start-up recovery on what the killed one left.
class SigkillTest : public PrepareDaemonTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SigkillTest, SurvivesSigkillAtEveryStepOfPrepareAndUnprepare) {
  const bool retry_on_other_instance = GetParam();
  const std::string uid = "22222222-0000-4000-8000-000000000001";
  server_->PutClaim(
      Claim("vm", uid, {{"gpu", "gpu-0000-01-00-0"}, {"vgpu", "mdev-0000-3b-00-0-nvidia-222-0"}}));
  const SimClaim claim{"vms", "vm", uid};
  const std::vector<std::string> steps = CleanRunSteps(claim);
  ASSERT_GE(steps.size(), 14u);
  KillAtEveryStep(
      claim, steps, retry_on_other_instance,
      [&] {
        // Prepared: both GPU functions on vfio-pci, the mdev exists, both CDI specs are there.
        EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
        EXPECT_EQ(Driver("0000:01:00.1"), "vfio-pci");
        EXPECT_FALSE(fs::is_empty(dir_ + "/sys/bus/mdev/devices"));
        EXPECT_EQ(CdiFiles().size(), 3u);  // the devices' spec and one metadata spec per request
      },
      [&] { EXPECT_TRUE(fs::is_empty(dir_ + "/sys/bus/mdev/devices")); });
}

// The same for a vGPU on an NVIDIA vGPU VF: its type is set and cleared, the VF never leaves
// nvidia, and no kill leaves a type on a VF that the checkpoint does not record.
TEST_P(SigkillTest, SurvivesSigkillAtEveryStepOfAVgpuOnAVf) {
  const bool retry_on_other_instance = GetParam();
  static const std::map<std::string, std::string> kVgpuVfs = {{"0000:41:00.4", "nvidia"},
                                                              {"0000:41:00.5", "nvidia"}};
  fixture_ = "vgpu-vf";
  host_drivers_ = &kVgpuVfs;
  vgpu_vfs_ = {"0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7"};
  FreshNode();
  const std::string uid = "22222222-0000-4000-8000-000000000002";
  server_->PutClaim(
      Claim("vm", uid, {{"vgpu", "vgpu-0000-41-00-4-1415"}, {"vgpu2", "vgpu-0000-41-00-5-1415"}}));
  const SimClaim claim{"vms", "vm", uid};
  const std::vector<std::string> steps = CleanRunSteps(claim);
  EXPECT_THAT(steps, ::testing::Contains("vgpu-create:0000:41:00.4"));
  EXPECT_THAT(steps, ::testing::Contains("vgpu-remove:0000:41:00.5"));
  KillAtEveryStep(claim, steps, retry_on_other_instance, [&] {
    EXPECT_EQ(VgpuType("0000:41:00.4"), "1415\n");
    EXPECT_EQ(VgpuType("0000:41:00.5"), "1415\n");
    EXPECT_EQ(Driver("0000:41:00.4"), "nvidia");
    EXPECT_EQ(CdiFiles().size(), 3u);  // the devices' spec and one metadata spec per request
  });
}

INSTANTIATE_TEST_SUITE_P(RetryTarget, SigkillTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "RetryOnTheOtherInstance" : "RetryAfterRestart";
                         });

// The same with two VMs starting at once: a GPU-and-vGPU claim and a VF claim are prepared in
// parallel (two kubelet calls), then unprepared in parallel, and the daemon is killed before each
// step of the run; which claim's step that is depends on how the two interleave, and the outcome
// must not: after the retries both claims are prepared, then gone, with nothing left behind.
// Retries go to a restarted daemon and to the other instance in turn.
TEST_F(PrepareDaemonTest, SurvivesSigkillAtEveryStepWithAnotherPrepareInFlight) {
  const std::string gpu_uid = "33333333-0000-4000-8000-000000000001";
  const std::string vf_uid = "33333333-0000-4000-8000-000000000002";
  server_->PutClaim(Claim(
      "vm", gpu_uid, {{"gpu", "gpu-0000-01-00-0"}, {"vgpu", "mdev-0000-3b-00-0-nvidia-222-0"}}));
  server_->PutClaim(Claim("vm-nic", vf_uid, {{"nic", "vf-0000-5e-02-1"}}));
  const SimClaim gpu{"vms", "vm", gpu_uid};
  const SimClaim vf{"vms", "vm-nic", vf_uid};
  // Both calls at once; each answer is the call's or its claim's error, empty when it worked.
  using Errors = std::pair<std::string, std::string>;
  const Errors ok;
  const auto both = [&](RegisteredPlugin& plugin, bool prepare) {
    const auto call = [&](const SimClaim& claim) -> std::string {
      if (prepare) {
        auto r = sim_.Prepare(plugin, {claim});
        return r.ok() ? r->claims().at(claim.uid).error() : r.error().message;
      }
      auto r = sim_.Unprepare(plugin, {claim});
      return r.ok() ? r->claims().at(claim.uid).error() : r.error().message;
    };
    auto other = std::async(std::launch::async, [&] { return call(vf); });
    std::string first = call(gpu);
    return Errors(std::move(first), other.get());
  };
  const std::string step_log = dir_ + "/steps.log";
  StartDaemon({"VFIO_DRA_SIM_STEP_LOG=" + step_log});
  ASSERT_EQ(both(plugin_, true), ok) << daemon_->Log();
  ASSERT_EQ(both(plugin_, false), ok) << daemon_->Log();
  size_t steps = 0;
  {
    std::ifstream in(step_log);
    for (std::string line; std::getline(in, line);) ++steps;
  }
  ASSERT_GE(steps, 20u);

  for (size_t k = 1; k <= steps; ++k) {
    SCOPED_TRACE("SIGKILL before step " + std::to_string(k) + " of both claims' steps");
    const bool retry_on_other_instance = k % 2 == 0;
    FreshNode();
    if (retry_on_other_instance) StartSecondInstance();
    StartDaemon({"VFIO_DRA_SIM_CRASH_AT_STEP=" + std::to_string(k)});
    const auto retry_target = [&]() -> RegisteredPlugin& {
      EXPECT_EQ(daemon_->WaitForExit(std::chrono::seconds(10)), 128 + SIGKILL);
      if (retry_on_other_instance) return second_plugin_;
      StartDaemon();
      return plugin_;
    };
    RegisteredPlugin* serving = &plugin_;
    bool killed = false;
    if (both(plugin_, true) != ok) {
      killed = true;
      serving = &retry_target();
      ExpectAccountedFor("after the kill in prepare");
      ASSERT_EQ(both(*serving, true), ok) << daemon_->Log();
    }
    EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
    EXPECT_EQ(Driver("0000:01:00.1"), "vfio-pci");
    EXPECT_EQ(Driver("0000:5e:02.1"), "vfio-pci");
    EXPECT_FALSE(fs::is_empty(dir_ + "/sys/bus/mdev/devices"));
    size_t specs = 0;
    for (const std::string& file : CdiFiles()) specs += file[0] == '.' ? 0 : 1;
    EXPECT_EQ(specs, 5u);  // each claim's devices spec, one metadata spec per request
    ExpectAccountedFor("prepared");

    if (both(*serving, false) != ok) {
      ASSERT_FALSE(killed) << "a failure after the retry that was no kill";
      killed = true;
      RegisteredPlugin& target = retry_target();
      ExpectAccountedFor("after the kill in unprepare");
      ASSERT_EQ(both(target, false), ok) << daemon_->Log();
    }
    EXPECT_TRUE(killed) << "the daemon was never killed";
    for (const auto& [address, host] : HostDrivers()) EXPECT_EQ(Driver(address), host) << address;
    EXPECT_TRUE(fs::is_empty(dir_ + "/sys/bus/mdev/devices"));
    EXPECT_TRUE(CdiFiles().empty());
    EXPECT_TRUE(Checkpoint()["claims"].empty());
    if (HasFailure()) break;
  }
}

// Where a daemon pauses (step_pause.h): its FIFOs, and the environment that makes it pause.
class PausePoint {
 public:
  explicit PausePoint(const std::string& dir) : dir_(dir) {
    fs::create_directories(dir_);
    for (const char* fifo : {"/paused", "/resume"}) {
      fs::remove(dir_ + fifo);
      EXPECT_EQ(::mkfifo((dir_ + fifo).c_str(), 0600), 0) << dir_ << fifo;
    }
    paused_ = ::open((dir_ + "/paused").c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(paused_, 0);
  }
  ~PausePoint() {
    if (paused_ >= 0) ::close(paused_);
  }
  PausePoint(const PausePoint&) = delete;
  PausePoint& operator=(const PausePoint&) = delete;
  std::vector<std::string> Env(const std::string& steps) const {
    return {"VFIO_DRA_TEST_PAUSE_AT=" + steps, "VFIO_DRA_TEST_PAUSE_DIR=" + dir_};
  }
  // The step a thread of the daemon paused at; "" when none did within a generous bound.
  std::string Await() const { return AwaitPause(paused_, 60); }
  bool Resume() const { return ResumePaused(dir_); }

 private:
  std::string dir_;
  int paused_ = -1;
};

// The recovery race of a rolling update, with processes and a SIGKILL at every step: instance A
// is killed before a step of preparing claim 1 (a record in PrepareStarted stays, its locks die
// with A); instance B is preparing claim 2 (PrepareStarted, its device locked); A restarts, and
// its recovery sees claim 2 in PrepareStarted. It rolls back claim 1, whose devices nobody holds;
// B then finishes claim 2 before A's recovery takes claim 2's device lock. A must leave claim 2 as
// B left it, prepared, and the kubelet's retry of claim 1 prepares it on A.
TEST_F(PrepareDaemonTest, SigkillAtEveryStepThenRecoveryLeavesAPrepareTheOtherInstanceFinished) {
  const std::string gpu_uid = "44444444-0000-4000-8000-000000000001";
  const std::string vf_uid = "44444444-0000-4000-8000-000000000002";
  server_->PutClaim(Claim("vm", gpu_uid, {{"gpu", "gpu-0000-01-00-0"}}));
  server_->PutClaim(Claim("vm-nic", vf_uid, {{"nic", "vf-0000-5e-02-1"}}));
  const SimClaim gpu{"vms", "vm", gpu_uid};
  const SimClaim vf{"vms", "vm-nic", vf_uid};
  const auto error_of = [](const auto& answer, const std::string& uid) {
    return answer.ok() ? answer->claims().at(uid).error() : answer.error().message;
  };
  // The steps of claim 1's prepare, from a run without a kill.
  const std::string step_log = dir_ + "/steps.log";
  StartDaemon({"VFIO_DRA_SIM_STEP_LOG=" + step_log});
  ASSERT_EQ(error_of(sim_.Prepare(plugin_, {gpu}), gpu_uid), "") << daemon_->Log();
  ASSERT_EQ(error_of(sim_.Unprepare(plugin_, {gpu}), gpu_uid), "") << daemon_->Log();
  std::vector<std::string> steps;
  {
    std::ifstream in(step_log);
    for (std::string line; std::getline(in, line) && line != "prepare:done";) {
      steps.push_back(line);
    }
    steps.push_back("prepare:done");
  }
  ASSERT_GE(steps.size(), 4u);

  for (const std::string& step : steps) {
    SCOPED_TRACE("SIGKILL of A before step " + step + " of claim 1's prepare");
    FreshNode();
    PausePoint pause_a(dir_ + "/pause-a");
    PausePoint pause_b(dir_ + "/pause-b");
    StartDaemon(pause_a.Env(step));
    auto first = std::async(std::launch::async, [&] { return sim_.Prepare(plugin_, {gpu}); });
    ASSERT_EQ(pause_a.Await(), step) << daemon_->Log();
    ASSERT_TRUE(daemon_->Signal(SIGKILL));
    ASSERT_EQ(daemon_->WaitForExit(std::chrono::seconds(20)), 128 + SIGKILL);
    EXPECT_NE(error_of(first.get(), gpu_uid), "");

    // B prepares claim 2 and is held while it binds the VF.
    StartInstance(pause_b.Env("bind:0000:5e:02.1"), "registry-b", {"--pod-uid", "b"}, second_,
                  second_plugin_);
    auto second =
        std::async(std::launch::async, [&] { return sim_.Prepare(second_plugin_, {vf}); });
    ASSERT_EQ(pause_b.Await(), "bind:0000:5e:02.1") << second_->Log();
    ASSERT_EQ(Checkpoint()["claims"][vf_uid]["state"], "PrepareStarted");

    // A restarts; its recovery has seen claim 2 in PrepareStarted when B finishes it.
    LaunchInstance(pause_a.Env("recover:" + vf_uid), "registry", {}, daemon_);
    ASSERT_EQ(pause_a.Await(), "recover:" + vf_uid) << daemon_->Log();
    const bool gpu_kept = Checkpoint()["claims"].contains(gpu_uid);
    if (gpu_kept) {
      EXPECT_EQ(Checkpoint()["claims"][gpu_uid]["state"], "PrepareCompleted");
    } else {
      EXPECT_EQ(Driver("0000:01:00.0"), "nvidia") << "claim 1 was rolled back first";
    }
    ASSERT_TRUE(pause_b.Resume());
    ASSERT_EQ(error_of(second.get(), vf_uid), "") << second_->Log();
    ASSERT_EQ(Checkpoint()["claims"][vf_uid]["state"], "PrepareCompleted");
    const std::vector<std::string> specs = CdiFiles();
    ASSERT_TRUE(pause_a.Resume());
    ConnectInstance("registry", *daemon_, plugin_);
    ASSERT_FALSE(HasFailure());

    EXPECT_EQ(Driver("0000:5e:02.1"), "vfio-pci") << "A's recovery undid claim 2";
    EXPECT_EQ(Checkpoint()["claims"][vf_uid]["state"], "PrepareCompleted");
    EXPECT_EQ(CdiFiles(), specs);
    EXPECT_THAT(daemon_->Log(), HasSubstr("not rolling back a prepare that another call finished"));
    ExpectAccountedFor("after A's recovery");

    ASSERT_EQ(error_of(sim_.Prepare(plugin_, {gpu}), gpu_uid), "") << daemon_->Log();
    EXPECT_EQ(Driver("0000:01:00.0"), "vfio-pci");
    ASSERT_EQ(error_of(sim_.Unprepare(plugin_, {gpu}), gpu_uid), "") << daemon_->Log();
    ASSERT_EQ(error_of(sim_.Unprepare(second_plugin_, {vf}), vf_uid), "") << second_->Log();
    for (const auto& [address, host] : HostDrivers()) EXPECT_EQ(Driver(address), host) << address;
    EXPECT_TRUE(CdiFiles().empty());
    EXPECT_TRUE(Checkpoint()["claims"].empty());
    if (HasFailure()) break;
  }
}

// The simulated PF driver's VF settings (see vfio::MakeFileVfNetwork): the fixture's i40e PF
// 0000:5e:00.0 with 8 VFs as a fresh PF has them.
void SeedVfSettings(const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir + "/0000:5e:00.0");
  std::ofstream(dir + "/0000:5e:00.0/netdev") << "ens5f0\n";
  for (int i = 0; i < 8; ++i) {
    std::ofstream(dir + "/0000:5e:00.0/vf" + std::to_string(i) + ".json")
        << R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false})";
  }
}

// An SR-IOV VF for a KubeVirt VM, end to end through the daemon: the claim (a template claim of
// pod virt-launcher-vm, claim name "sriov") sets a VLAN and trust, the pod's kubevirt.io/
// dra-networks annotation sets the MAC. Prepare configures the VF before binding it, writes the
// MAC into the claim's status and the metadata file, and unprepare puts the VF back as it was; the
// same holds when the daemon is killed before any step and the kubelet retries on a restarted
// daemon or on the other instance.
TEST_F(PrepareDaemonTest, AKubevirtVfGetsItsMacVlanAndTrustAndLosesThemAtUnprepareDespiteSigkill) {
  const std::string uid = "44444444-0000-4000-8000-000000000001";
  const std::string vfnet = dir_ + "/vfnet";
  every_instance_args_ = {"--simulated-vf-network-dir", vfnet};
  json claim = Claim("vm-sriov-abcde", uid, {{"vf", "vf-0000-5e-02-1"}});
  claim["metadata"]["annotations"] = {{"resource.kubernetes.io/pod-claim-name", "sriov"}};
  claim["status"]["allocation"]["devices"]["config"] = {{{"source", "FromClaim"},
                                                         {"requests", {"vf"}},
                                                         {"opaque",
                                                          {{"driver", kDriver},
                                                           {"parameters",
                                                            {{"apiVersion", "vfio.dra.io/v1alpha1"},
                                                             {"kind", "VfioConfig"},
                                                             {"macAddress", "02:00:00:00:00:01"},
                                                             {"vlan", 100},
                                                             {"trust", true}}}}}}};
  claim["status"]["reservedFor"] = {
      {{"resource", "pods"}, {"name", "virt-launcher-vm"}, {"uid", "pod-uid-vm"}}};
  server_->PutClaim(claim);
  server_->PutPod(
      {{"metadata",
        {{"namespace", "vms"},
         {"name", "virt-launcher-vm"},
         {"uid", "pod-uid-vm"},
         {"annotations",
          {{"kubevirt.io/dra-networks",
            R"([{"claimName":"other","requestName":"vf","mac":"02:00:00:00:00:99"},)"
            R"({"claimName":"sriov","requestName":"vf","mac":"02:00:00:00:be:ef"}])"}}}}},
       {"spec", {{"resourceClaims", {{{"name", "sriov"}}}}}}});
  const SimClaim sim_claim{"vms", "vm-sriov-abcde", uid};
  const json fresh =
      json::parse(R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false})");
  const json configured =
      json::parse(R"({"mac":"02:00:00:00:be:ef","vlan":100,"qos":0,"spoofchk":true,"trust":true})");
  const auto vf_state = [&] { return json::parse(Slurp(vfnet + "/0000:5e:00.0/vf1.json")); };
  const auto expect_prepared = [&] {
    EXPECT_EQ(Driver("0000:5e:02.1"), "vfio-pci");
    EXPECT_EQ(vf_state(), configured);
    EXPECT_EQ(json::parse(Slurp(vfnet + "/0000:5e:00.0/vf0.json")), fresh);  // its neighbour
    // Written in the background after the prepare answered.
    EXPECT_TRUE(server_->WaitForClaim(
        "vms", "vm-sriov-abcde",
        [](const json& stored) { return stored["status"].contains("devices"); },
        std::chrono::seconds(60)));
    const json devices = server_->Claim("vms", "vm-sriov-abcde")["status"]["devices"];
    ASSERT_EQ(devices.size(), 1u) << devices.dump();
    EXPECT_EQ(devices[0]["driver"], kDriver);
    EXPECT_EQ(devices[0]["pool"], "node1");
    EXPECT_EQ(devices[0]["device"], "vf-0000-5e-02-1");
    EXPECT_EQ(devices[0]["networkData"]["hardwareAddress"], "02:00:00:00:be:ef");
    ASSERT_EQ(devices[0]["conditions"].size(), 1u);
    EXPECT_EQ(devices[0]["conditions"][0]["type"], "Ready");
    EXPECT_EQ(devices[0]["conditions"][0]["status"], "True");
    const json metadata =
        json::parse(Slurp(dir_ + "/data/dra-device-metadata/" + uid + "_vf.json"));
    EXPECT_EQ(metadata["podClaimName"], "sriov");
    EXPECT_EQ(metadata["requests"][0]["devices"][0]["attributes"]["macAddress"],
              json({{"string", "02:00:00:00:be:ef"}}));
  };

  SeedVfSettings(vfnet);
  const std::string step_log = dir_ + "/steps.log";
  StartDaemon({"VFIO_DRA_SIM_STEP_LOG=" + step_log});
  ASSERT_EQ(sim_.Prepare(plugin_, {sim_claim})->claims().at(uid).error(), "") << daemon_->Log();
  expect_prepared();
  ASSERT_EQ(sim_.Unprepare(plugin_, {sim_claim})->claims().at(uid).error(), "");
  EXPECT_EQ(vf_state(), fresh);
  EXPECT_EQ(Driver("0000:5e:02.1"), "iavf");
  std::vector<std::string> steps;
  {
    std::ifstream in(step_log);
    for (std::string line; std::getline(in, line);) steps.push_back(line);
  }
  ASSERT_NE(std::find(steps.begin(), steps.end(), "vf-config:0000:5e:02.1"), steps.end());
  ASSERT_NE(std::find(steps.begin(), steps.end(), "vf-restore:0000:5e:02.1"), steps.end());
  ASSERT_NE(std::find(steps.begin(), steps.end(), "claim-status:write"), steps.end());
  size_t prepare_steps = 0;
  while (prepare_steps < steps.size() && steps[prepare_steps] != "cdi:remove") ++prepare_steps;

  for (size_t k = 1; k <= steps.size(); ++k) {
    SCOPED_TRACE("SIGKILL before step " + std::to_string(k) + " (" + steps[k - 1] + ")");
    FreshNode();
    SeedVfSettings(vfnet);
    server_->PutClaim(claim);  // a fresh claim: no status from the last round
    PrepareAndUnprepareThroughAKill(sim_claim, k, prepare_steps, k % 2 == 0, expect_prepared);
    EXPECT_EQ(vf_state(), fresh);
    if (HasFailure()) break;
  }
}

size_t CountOf(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// The claim's status is information for the cluster, not a condition for the VM to run: while
// the API refuses the status write (here 403, as a 1.36 server does without the
// resourceclaims/driver right) the prepare answers success, the metric shows the write pending and
// the log says so once; when the API lets it through, the retry lands it.
TEST_F(PrepareDaemonTest, AVfPrepareSucceedsWhileItsStatusIsRefusedAndTheStatusLandsLater) {
  const std::string uid = "44444444-0000-4000-8000-000000000003";
  const std::string vfnet = dir_ + "/vfnet";
  every_instance_args_ = {"--simulated-vf-network-dir", vfnet};
  SeedVfSettings(vfnet);
  json claim = Claim("vm-nic", uid, {{"vf", "vf-0000-5e-02-1"}});
  claim["status"]["allocation"]["devices"]["config"] = {
      {{"source", "FromClaim"},
       {"requests", {"vf"}},
       {"opaque",
        {{"driver", kDriver},
         {"parameters",
          {{"apiVersion", "vfio.dra.io/v1alpha1"},
           {"kind", "VfioConfig"},
           {"macAddress", "02:00:00:00:00:42"}}}}}}};
  server_->PutClaim(claim);
  const std::string status_path =
      "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/vm-nic/status";
  server_->FailNext(1 << 30, 403, 0, status_path);
  StartDaemon();
  const int metrics_port = MetricsPort();
  ASSERT_GT(metrics_port, 0) << daemon_->Log();
  httplib::Client http("127.0.0.1", metrics_port);
  const SimClaim sim_claim{"vms", "vm-nic", uid};

  auto prepared = sim_.Prepare(plugin_, {sim_claim});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_EQ(prepared->claims().at(uid).error(), "") << daemon_->Log();
  EXPECT_EQ(Driver("0000:5e:02.1"), "vfio-pci");
  const auto refused = [&](size_t times) {
    return [&, times](const std::vector<RecordedRequest>& requests) {
      return static_cast<size_t>(
                 std::count_if(requests.begin(), requests.end(), [&](const RecordedRequest& r) {
                   return r.method == "PATCH" && r.path == status_path && r.status == 403;
                 })) >= times;
    };
  };
  // Retried in the background, with back-off.
  ASSERT_TRUE(server_->WaitForRequests(refused(2), std::chrono::seconds(60))) << daemon_->Log();
  auto behind = http.Get("/metrics");
  ASSERT_TRUE(behind);
  EXPECT_EQ(Sample(behind->body, "vfio_dra_claim_status_pending"), 1) << behind->body;
  EXPECT_TRUE(server_->Claim("vms", "vm-nic")["status"]["devices"].is_null());

  server_->ClearFaults();
  ASSERT_TRUE(server_->WaitForClaim(
      "vms", "vm-nic",
      [](const json& stored) {
        const json& devices = stored["status"]["devices"];
        return devices.is_array() && devices.size() == 1 &&
               devices[0]["networkData"]["hardwareAddress"] == "02:00:00:00:00:42";
      },
      std::chrono::seconds(60)))
      << daemon_->Log();
  // The metric follows the write's answer: wait for the page to say it landed.
  std::string page;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       std::chrono::steady_clock::now() < until;) {
    auto landed = http.Get("/metrics");
    ASSERT_TRUE(landed);
    page = landed->body;
    if (Sample(page, R"(vfio_dra_claim_status_writes_total{result="ok"})") == 1) break;
  }
  EXPECT_EQ(Sample(page, "vfio_dra_claim_status_pending"), 0) << page;
  EXPECT_GE(Sample(page, R"(vfio_dra_claim_status_writes_total{result="error"})"), 2) << page;
  // One line when the write started failing and one when it landed, not one per retry.
  const std::string after = daemon_->Log();
  EXPECT_EQ(CountOf(after, "cannot write the claim's status"), 1u) << after;
  EXPECT_EQ(CountOf(after, "claim status written after failing"), 1u) << after;

  ASSERT_EQ(sim_.Unprepare(plugin_, {sim_claim})->claims().at(uid).error(), "");
  EXPECT_EQ(Driver("0000:5e:02.1"), "iavf");
}

// A malformed kubevirt.io/dra-networks annotation fails only its claim, quoting the annotation,
// and leaves the VF untouched; fixing the pod lets the kubelet's retry through.
TEST_F(PrepareDaemonTest, AMalformedDraNetworksAnnotationFailsTheClaimQuotingIt) {
  const std::string uid = "44444444-0000-4000-8000-000000000002";
  const std::string vfnet = dir_ + "/vfnet";
  every_instance_args_ = {"--simulated-vf-network-dir", vfnet};
  SeedVfSettings(vfnet);
  json claim = Claim("vm-sriov", uid, {{"vf", "vf-0000-5e-02-1"}});
  claim["status"]["reservedFor"] = {
      {{"resource", "pods"}, {"name", "virt-launcher-vm"}, {"uid", "pod-uid-vm"}}};
  server_->PutClaim(claim);
  json pod = {
      {"metadata",
       {{"namespace", "vms"},
        {"name", "virt-launcher-vm"},
        {"uid", "pod-uid-vm"},
        {"annotations", {{"kubevirt.io/dra-networks", R"([{"claimName":"vm-sriov",)"}}}}},
      {"spec", {{"resourceClaims", {{{"name", "vm-sriov"}, {"resourceClaimName", "vm-sriov"}}}}}}};
  server_->PutPod(pod);
  StartDaemon();
  const SimClaim sim_claim{"vms", "vm-sriov", uid};
  auto prepared = sim_.Prepare(plugin_, {sim_claim});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  const std::string error = prepared->claims().at(uid).error();
  EXPECT_NE(error.find("kubevirt.io/dra-networks"), std::string::npos) << error;
  EXPECT_NE(error.find(R"([{"claimName":"vm-sriov",)"), std::string::npos) << error;
  EXPECT_NE(error.find("vms/virt-launcher-vm"), std::string::npos) << error;
  EXPECT_EQ(Driver("0000:5e:02.1"), "iavf");
  EXPECT_EQ(json::parse(Slurp(vfnet + "/0000:5e:00.0/vf1.json"))["mac"], "00:00:00:00:00:00");
  EXPECT_TRUE(Checkpoint()["claims"].empty());

  pod["metadata"]["annotations"]["kubevirt.io/dra-networks"] =
      R"([{"claimName":"vm-sriov","requestName":"vf","mac":"02:00:00:00:00:07"}])";
  server_->PutPod(pod);
  prepared = sim_.Prepare(plugin_, {sim_claim});
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  EXPECT_EQ(prepared->claims().at(uid).error(), "") << daemon_->Log();
  EXPECT_EQ(json::parse(Slurp(vfnet + "/0000:5e:00.0/vf1.json"))["mac"], "02:00:00:00:00:07");
  ASSERT_EQ(sim_.Unprepare(plugin_, {sim_claim})->claims().at(uid).error(), "");
  EXPECT_EQ(json::parse(Slurp(vfnet + "/0000:5e:00.0/vf1.json"))["mac"], "00:00:00:00:00:00");
}

}  // namespace
}  // namespace vfio_dra::testing
