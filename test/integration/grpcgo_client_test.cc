// The daemon's gRPC server against grpc-go, the client real kubelets use: test/grpcgo's client
// registers the daemon (vfio-dra-sim-daemon on a simulated kernel, the fake API server behind
// it), checks gRPC health, prepares and unprepares claims on distinct devices concurrently over
// one connection through DRA v1 and v1beta1, reads and cancels the health stream (v1, then
// v1alpha1), and sends calls the plugin must refuse. Every other test talks to the daemon through
// gRPC C++; this one is the independent check that the server speaks to grpc-go as a kubelet
// needs. The fake API server, not a real one: the test is about the kubelet-facing socket, and it
// starts hundreds of daemons in a suite that must stay fast (test/cluster runs the plugin against
// the real API server).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "fake_apiserver.h"
#include "integration/daemon_process.h"
#include "kubelet_simulator.h"
#include "sysfs_fixture.h"

extern char** environ;

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr const char* kDriver = "vfio.dra.io";
constexpr const char* kPolicy =
    "version: v1\n"
    "select:\n"
    "  - kind: hostdev\n"
    "    address: \"0000:06:00.0\"\n";

// A claim on each kind of device of the vm-host fixture, and what preparing it changes.
struct ClaimCase {
  std::string name, uid, request, device;
  std::vector<std::string> functions;  // bound to vfio-pci while prepared
};
const std::vector<ClaimCase>& Cases() {
  static const std::vector<ClaimCase> kCases = {
      {"gpu",
       "22222222-0000-4000-8000-000000000001",
       "gpu",
       "gpu-0000-01-00-0",
       {"0000:01:00.0", "0000:01:00.1"}},
      {"nic", "22222222-0000-4000-8000-000000000002", "nic", "vf-0000-5e-02-1", {"0000:5e:02.1"}},
      {"disk",
       "22222222-0000-4000-8000-000000000003",
       "disk",
       "hostdev-0000-06-00-0",
       {"0000:06:00.0"}},
      {"vgpu",
       "22222222-0000-4000-8000-000000000004",
       "vgpu",
       "mdev-0000-3b-00-0-nvidia-222-0",
       {}}};
  return kCases;
}
const std::map<std::string, std::string>& HostDrivers() {
  static const std::map<std::string, std::string> kDrivers = {{"0000:01:00.0", "nvidia"},
                                                              {"0000:01:00.1", "snd_hda_intel"},
                                                              {"0000:5e:02.1", "iavf"},
                                                              {"0000:06:00.0", "nvme"}};
  return kDrivers;
}

json AllocatedClaim(const ClaimCase& c) {
  return {{"metadata", {{"namespace", "vms"}, {"name", c.name}, {"uid", c.uid}, {"generation", 1}}},
          {"spec", json::object()},
          {"status",
           {{"allocation",
             {{"devices",
               {{"results",
                 {{{"request", c.request},
                   {"driver", kDriver},
                   {"pool", "node1"},
                   {"device", c.device}}}}}}}}}}};
}

// The Go client as a child process: its stdout (one JSON object per line) read through a pipe
// with a deadline, its stdin a socket (a write after it died fails instead of raising SIGPIPE),
// its stderr kept in a file for failure messages.
class ClientProcess {
 public:
  ClientProcess(const std::vector<std::string>& args, const std::string& stderr_path)
      : stderr_path_(stderr_path) {
    int out[2];
    int in[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return;
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) {
      ::close(out[0]);
      ::close(out[1]);
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> argv_strings = args;
    std::vector<char*> argv;
    argv.reserve(argv_strings.size() + 1);
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(in[1]);
    stdout_ = out[0];
    stdin_ = in[0];
    if (pid_ > 0) pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  ~ClientProcess() {
    if (pid_ > 0 && !exit_code_.has_value()) {
      ::kill(pid_, SIGKILL);
      WaitForExit(std::chrono::seconds(10));
    }
    for (int fd : {stdout_, stdin_, pidfd_}) {
      if (fd >= 0) ::close(fd);
    }
  }
  ClientProcess(const ClientProcess&) = delete;
  ClientProcess& operator=(const ClientProcess&) = delete;

  bool started() const { return pid_ > 0 && pidfd_ >= 0; }

  // The next line of stdout; nullopt at its end or when `timeout` passes first.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      if (const size_t eol = buffer_.find('\n'); eol != std::string::npos) {
        std::string line = buffer_.substr(0, eol);
        buffer_.erase(0, eol + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{stdout_, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return std::nullopt;
      char chunk[4096];
      const ssize_t n = ::read(stdout_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  bool WriteLine(const std::string& line) {
    const std::string data = line + "\n";
    return ::send(stdin_, data.data(), data.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(data.size());
  }
  std::optional<int> WaitForExit(std::chrono::milliseconds timeout) {
    if (exit_code_.has_value()) return exit_code_;
    pollfd p{pidfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return std::nullopt;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }
  std::string Stderr() const {
    std::ifstream in(stderr_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int stdout_ = -1;
  int stdin_ = -1;
  std::string buffer_;
  std::string stderr_path_;
  std::optional<int> exit_code_;
};

class GrpcGoClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-grpcgo-XXXXXX";
    dir_ = mkdtemp(tmpl);
    FakeApiServerOptions options;
    options.rbac_file = ShippedRbacFile();
    server_ = std::make_unique<FakeApiServer>(options);
    ASSERT_TRUE(server_->Start());
    kubeconfig_ = server_->WriteKubeconfig(dir_);
    server_->PutNode("node1", "6a0a1d47-0000-4000-8000-0000000000bb");
    std::ofstream(dir_ + "/policy.yaml") << kPolicy;
    BuildFixture("vm-host", dir_ + "/sys");
    fs::create_directories(dir_ + "/registry");
  }
  void TearDown() override {
    daemon_.reset();
    for (const RecordedRequest& r : server_->Requests()) {
      EXPECT_NE(r.status, 403) << r.method << " " << r.path << " is not allowed by rbac.yaml";
    }
    server_->Stop();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void StartDaemon(const std::vector<std::string>& more_flags = {}) {
    std::vector<std::string> command = ServeCommand(VFIO_DRA_SIM_DAEMON_BINARY, kubeconfig_,
                                                    dir_ + "/registry", dir_ + "/data", dir_);
    command.insert(command.end(), {"--config", dir_ + "/policy.yaml", "--metrics-address",
                                   "127.0.0.1:0", "-v", "4"});
    command.insert(command.end(), more_flags.begin(), more_flags.end());
    daemon_ = std::make_unique<DaemonProcess>(command, dir_ + "/daemon.log");
  }
  std::string Driver(const std::string& address) const {
    std::error_code ec;
    auto target = fs::read_symlink(dir_ + "/sys/bus/pci/devices/" + address + "/driver", ec);
    return ec ? "" : target.filename().string();
  }
  std::string CdiSpec(const ClaimCase& c) const {
    return dir_ + "/cdi/vfio.dra.io-vfio_" + c.uid + ".json";
  }
  std::string MetadataFile(const ClaimCase& c) const {
    return dir_ + "/data/dra-device-metadata/" + c.uid + "_" + c.request + ".json";
  }
  // What the node must look like with every claim prepared, or with none.
  void ExpectNode(bool prepared) const {
    for (const ClaimCase& c : Cases()) {
      SCOPED_TRACE(c.name);
      EXPECT_EQ(fs::exists(CdiSpec(c)), prepared);
      EXPECT_EQ(fs::exists(MetadataFile(c)), prepared);
      for (const std::string& f : c.functions) {
        EXPECT_EQ(Driver(f), prepared ? "vfio-pci" : HostDrivers().at(f)) << f;
      }
    }
    EXPECT_EQ(fs::is_empty(dir_ + "/sys/bus/mdev/devices"), !prepared);
  }
  // What one run of the grpc-go client printed.
  struct ClientRun {
    std::vector<json> steps;
    std::string transcript;
    std::chrono::milliseconds elapsed{0};
  };
  // Starts the daemon's claims in the fake API server and the daemon (with `daemon_flags`),
  // waits for its registration socket as the kubelet's plugin watcher does, then runs the client
  // with `client_flags` and every claim, reading its steps until Done. `on_step` sees each step
  // as it comes (and may answer the client).
  void RunClient(const std::vector<std::string>& daemon_flags,
                 const std::vector<std::string>& client_flags,
                 const std::function<void(const json&, ClientProcess&)>& on_step, ClientRun& run) {
    for (const ClaimCase& c : Cases()) server_->PutClaim(AllocatedClaim(c));
    StartDaemon(daemon_flags);
    KubeletSimulator watcher;
    auto socket = watcher.WaitForRegistrationSocket(dir_ + "/registry", std::chrono::seconds(30));
    ASSERT_TRUE(socket.ok()) << socket.error().message << daemon_->Log();
    std::vector<std::string> args = {VFIO_DRA_GRPCGO_CLIENT, "--registration-socket", *socket};
    args.insert(args.end(), client_flags.begin(), client_flags.end());
    for (const ClaimCase& c : Cases()) {
      args.push_back("--claim");
      args.push_back("vms/" + c.name + "/" + c.uid);
    }
    const auto start = Clock::now();
    ClientProcess client(args, dir_ + "/client.stderr");
    ASSERT_TRUE(client.started());
    bool done = false;
    // No step takes longer than the kubelet's 45 s deadline for a call, even on a busy machine.
    while (!done) {
      auto line = client.ReadLine(std::chrono::seconds(60));
      if (!line) break;
      run.transcript += *line + "\n";
      json step = json::parse(*line, nullptr, false);
      ASSERT_FALSE(step.is_discarded()) << "not JSON: " << *line;
      run.steps.push_back(step);
      done = step["step"] == "Done";
      on_step(step, client);
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_TRUE(done) << "the client stopped or hung:\n"
                      << run.transcript << client.Stderr() << "\n"
                      << daemon_->Log();
    run.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    ASSERT_EQ(client.WaitForExit(std::chrono::seconds(30)), 0) << client.Stderr();
  }

  std::string dir_, kubeconfig_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<DaemonProcess> daemon_;
};

std::set<std::string> DeviceNames(const std::vector<json>& slices) {
  std::set<std::string> names;
  for (const json& slice : slices) {
    for (const json& device : slice["spec"].value("devices", json::array())) {
      names.insert(device["name"].get<std::string>());
    }
  }
  return names;
}

// The steps of one kind from the client's output.
std::vector<json> StepsNamed(const std::vector<json>& steps, const std::string& name) {
  std::vector<json> out;
  for (const json& s : steps) {
    if (s.value("step", "") == name) out.push_back(s);
  }
  return out;
}

TEST_F(GrpcGoClientTest, AKubeletsGrpcGoClientRegistersPreparesWatchesAndIsRefusedCleanly) {
  std::set<std::string> pauses;
  ClientRun run;
  RunClient(
      {}, {"--pause"},
      [&](const json& step, ClientProcess& client) {
        if (step["step"] != "Paused") return;
        const std::string after = step["after"];
        const std::string service = step["service"];
        SCOPED_TRACE("after " + after + " through " + service);
        pauses.insert(after + " " + service);
        ExpectNode(after == "NodePrepareResources");
        ASSERT_TRUE(client.WriteLine("go on"));
      },
      run);
  if (HasFatalFailure()) return;
  const std::vector<json>& steps = run.steps;
  // The transcript shows how each answer came through to grpc-go (codes, headers, trailers).
  std::cout << "grpc-go client transcript (" << run.elapsed.count() << " ms):\n" << run.transcript;
  SCOPED_TRACE(run.transcript);
  EXPECT_EQ(pauses, (std::set<std::string>{"NodePrepareResources v1.DRAPlugin",
                                           "NodeUnprepareResources v1.DRAPlugin",
                                           "NodePrepareResources v1beta1.DRAPlugin",
                                           "NodeUnprepareResources v1beta1.DRAPlugin"}));

  // Registration, as the kubelet's plugin watcher does it.
  const auto info = StepsNamed(steps, "GetInfo");
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0]["code"], "OK");
  EXPECT_EQ(info[0]["type"], "DRAPlugin");
  EXPECT_EQ(info[0]["name"], kDriver);
  EXPECT_EQ(info[0]["endpoint"], dir_ + "/data/dra.sock");
  EXPECT_THAT(info[0]["supported_versions"].get<std::vector<std::string>>(),
              ElementsAre("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                          "v1alpha1.DRAResourceHealth"));
  const auto notified = StepsNamed(steps, "NotifyRegistrationStatus");
  ASSERT_EQ(notified.size(), 1u);
  EXPECT_EQ(notified[0]["code"], "OK");
  EXPECT_THAT(daemon_->Log(), HasSubstr("registered with the kubelet"));

  // gRPC health, first thing on the DRA socket and last, after every odd call.
  const auto health = StepsNamed(steps, "HealthCheck");
  ASSERT_EQ(health.size(), 2u);
  for (const json& h : health) {
    EXPECT_EQ(h["code"], "OK") << h["label"];
    EXPECT_EQ(h["status"], "SERVING") << h["label"];
  }

  // Each claim prepared and unprepared by its own call, through both API versions.
  for (const std::string service : {"v1.DRAPlugin", "v1beta1.DRAPlugin"}) {
    for (const std::string method : {"NodePrepareResources", "NodeUnprepareResources"}) {
      std::map<std::string, json> by_uid;
      for (const json& s : StepsNamed(steps, method)) {
        if (s["service"] == service) by_uid[s["uid"]] = s;
      }
      ASSERT_EQ(by_uid.size(), Cases().size()) << method << " " << service;
      for (const ClaimCase& c : Cases()) {
        SCOPED_TRACE(method + " " + service + " " + c.name);
        const json& s = by_uid.at(c.uid);
        ASSERT_EQ(s["code"], "OK") << s["message"];
        EXPECT_FALSE(s.contains("decode_error")) << s["decode_error"];
        ASSERT_EQ(s["claims"].size(), 1u);
        const json& result = s["claims"][c.uid];
        EXPECT_EQ(result["error"], "");
        if (method == "NodeUnprepareResources") continue;
        ASSERT_EQ(result["devices"].size(), 1u);
        const json& d = result["devices"][0];
        EXPECT_EQ(d["pool"], "node1");
        EXPECT_EQ(d["device"], c.device);
        EXPECT_EQ(d["request_names"], json::array({c.request}));
        EXPECT_EQ(d["cdi_device_ids"],
                  json::array({std::string(kDriver) + "/vfio=" + c.uid + "-" + c.device,
                               std::string(kDriver) + "/metadata=" + c.uid + "_" + c.request}));
      }
    }
  }

  // The health stream, through v1 (1.37+ kubelets) and then v1alpha1 (older ones): the first
  // message is the complete list of published devices; cancelling the stream ends it with
  // CANCELLED.
  const auto watch = StepsNamed(steps, "NodeWatchResources");
  const auto cancelled = StepsNamed(steps, "NodeWatchResourcesCancelled");
  ASSERT_EQ(watch.size(), 2u);
  ASSERT_EQ(cancelled.size(), 2u);
  const std::vector<std::string> health_services = {"v1.DRAResourceHealth",
                                                    "v1alpha1.DRAResourceHealth"};
  for (size_t i = 0; i < health_services.size(); ++i) {
    SCOPED_TRACE(health_services[i]);
    EXPECT_EQ(watch[i]["service"], health_services[i]);
    ASSERT_EQ(watch[i]["code"], "OK") << watch[i]["message"];
    EXPECT_EQ(watch[i]["timed_out"], false);
    std::set<std::string> reported;
    for (const json& d : watch[i]["devices"]) {
      EXPECT_EQ(d["pool"], "node1");
      EXPECT_EQ(d["health"], "HEALTHY") << d["device"];
      EXPECT_GE(d["health_check_timeout_seconds"].get<int64_t>(), 30) << d["device"];
      reported.insert(d["device"].get<std::string>());
    }
    // The slices are written in the background, maybe after the stream's first message.
    EXPECT_TRUE(server_->WaitForSlices(
        [&](const std::vector<json>& slices) { return DeviceNames(slices) == reported; },
        std::chrono::seconds(30)));
    EXPECT_EQ(reported, DeviceNames(server_->Slices()));
    EXPECT_EQ(reported.count(Cases()[0].device), 1u);
    EXPECT_EQ(cancelled[i]["service"], health_services[i]);
    EXPECT_EQ(cancelled[i]["code"], "Canceled");
  }

  // Methods the plugin does not have.
  for (const std::string name : {"UnknownMethod", "UnknownService"}) {
    const auto s = StepsNamed(steps, name);
    ASSERT_EQ(s.size(), 1u) << name;
    EXPECT_EQ(s[0]["code"], "Unimplemented") << name;
  }
  // A body that is not protobuf is refused (gRPC C++ says INTERNAL; the code is not the point).
  const auto malformed = StepsNamed(steps, "MalformedRequest");
  ASSERT_EQ(malformed.size(), 1u);
  EXPECT_NE(malformed[0]["code"], std::string("OK"));
  // After the calls whose deadline ran out (whatever they answered), the kubelet's unprepare
  // succeeds and leaves the node as it was.
  for (const std::string name : {"ShortDeadline", "ExpiringDeadline"}) {
    EXPECT_EQ(StepsNamed(steps, name).size(), 1u) << name;
  }
  const auto unprepare = StepsNamed(steps, "UnprepareAfterShortDeadlines");
  ASSERT_EQ(unprepare.size(), 1u);
  ASSERT_EQ(unprepare[0]["code"], "OK") << unprepare[0]["message"];
  EXPECT_EQ(unprepare[0]["claims"][Cases()[0].uid]["error"], "");
  ExpectNode(false);
  for (const auto& [address, host] : HostDrivers()) EXPECT_EQ(Driver(address), host) << address;
}

// With --close-idle-connections, the plugin closes the kubelet's connection once no call has
// been open for that long (the kubelet 1.34.0 idle-deadlock mitigation): grpc-go's ClientConn
// leaves READY without any call, and its next calls (health, prepare, unprepare) reconnect and are
// answered as before.
TEST_F(GrpcGoClientTest, AKubeletsGrpcGoClientReconnectsAfterThePluginClosesItsIdleConnection) {
  ClientRun run;
  RunClient(
      {"--close-idle-connections", "3"}, {"--idle-close-wait", "60s"},
      [](const json&, ClientProcess&) {}, run);
  if (HasFatalFailure()) return;
  const std::vector<json>& steps = run.steps;
  SCOPED_TRACE(run.transcript);
  const auto idle = StepsNamed(steps, "IdleClose");
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0]["state_before"], "READY");
  EXPECT_EQ(idle[0]["left_ready"], true) << "the plugin never closed the idle connection";
  const auto health = StepsNamed(steps, "HealthCheck");
  ASSERT_EQ(health.size(), 2u);
  for (const json& h : health) EXPECT_EQ(h["code"], "OK") << h["label"];
  for (const std::string method : {"NodePrepareResources", "NodeUnprepareResources"}) {
    const auto calls = StepsNamed(steps, method);
    ASSERT_EQ(calls.size(), Cases().size()) << method;
    for (const json& call : calls) {
      ASSERT_EQ(call["code"], "OK") << method << ": " << call["message"];
      EXPECT_EQ(call["claims"][call["uid"].get<std::string>()]["error"], "") << method;
    }
  }
  ExpectNode(false);
  // gRPC C++ closes the idle connection itself (GRPC_ARG_MAX_CONNECTION_IDLE_MS) and logs nothing
  // of it; the client's view above shows it, the daemon's log the limit it was given.
  EXPECT_NE(daemon_->Log().find("close_idle_connections_s=3"), std::string::npos) << daemon_->Log();
}

}  // namespace
}  // namespace vfio_dra::testing
