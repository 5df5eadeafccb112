// peer_bench: one DRA kubelet plugin measured as hack/bench-peer.sh compares two: vfio-dra (the
// real daemon on the simulated kernel, vfio-dra-sim-daemon) or the Go reference driver
// (sigs.k8s.io/dra-example-driver's kubelet plugin, built by hack/bench-peer.sh), each under the
// same fake API server (TLS, a 1.35 server: at most 128 devices a slice) and the same kubelet
// simulator (DRA v1, one kept connection). One run starts the plugin once and measures:
//   - start to published: process start until the server holds every slice of the pool;
//   - the idle plugin over a window: RSS, and CPU as utime+stime from /proc/PID/stat;
//   - NodePrepareResources of one one-device claim at a time (each followed by its unprepare);
//   - 32 one-device claims prepared at once (as many as there are devices, if fewer), and the
//     plugin's CPU per claim over those rounds, prepare and unprepare together.
// vfio-dra's node has `devices` SR-IOV VFs (PFs of at most 125 VFs, each VF its own IOMMU group);
// the reference generates `devices` fake GPUs. Prints JSON.
//   peer_bench --plugin vfio-dra|reference [--reference-binary PATH] [--devices N]
//              [--idle-seconds S] [--rounds R] [--dir DIR] [--cdi-base DIR]
// DIR (default /tmp) holds both plugins' data dirs (checkpoints), as a node's /var/lib does; the
// CDI specs and the simulated sysfs go under --cdi-base (default /dev/shm): /var/run/cdi is a
// tmpfs on nodes.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/file_io.h"
#include "discovery/inventory.h"
#include "fake_apiserver.h"
#include "integration/daemon_process.h"
#include "kubelet_simulator.h"
#include "latency_summary.h"
#include "process_cpu.h"
#include "slicepublisher/device_names.h"
#include "sysfs_fixture.h"
#include "tls_apiserver.h"

namespace {

using namespace vfio_dra;  // NOLINT(google-build-using-namespace): a benchmark's main
using Clock = std::chrono::steady_clock;
using bench::Ms;
using bench::Summary;
constexpr int kVfsPerPf = 125;
constexpr int kAtOnce = 32;
constexpr const char* kReferenceDriver = "gpu.example.com";

struct Options {
  std::string plugin;
  std::string reference_binary;
  int devices = 8;
  int idle_seconds = 60;
  int rounds = 10;
  std::string base = "/tmp";
  std::string cdi_base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
};

std::string Uid(int i) {
  char buffer[40];
  (void)std::snprintf(buffer, sizeof buffer, "c0000000-0000-4000-8000-%012d", i);
  return buffer;
}

std::string MakeTemp(const std::string& pattern) {
  std::vector<char> tmpl(pattern.begin(), pattern.end());
  tmpl.push_back('\0');
  const char* made = mkdtemp(tmpl.data());
  return made == nullptr ? "" : made;
}

// The PCI address of VF `i` of the node BuildVfNode builds.
std::string VfAddress(int i) {
  const int devfn = 16 + i % kVfsPerPf;
  return fmt::format("0000:{:02x}:{:02x}.{:x}", 0x40 + i / kVfsPerPf, devfn >> 3, devfn & 7);
}

// A node of `devices` VFs on PFs of at most kVfsPerPf, each VF its own IOMMU group, with the
// PFs' netdevs and VF settings as prepare_bench's node has them. Returns false with a message.
bool BuildVfNode(const std::string& mem_dir, int devices) {
  testing::SysfsFixture fx(mem_dir + "/sys");
  const int pfs = (devices + kVfsPerPf - 1) / kVfsPerPf;
  int group = 200;
  for (int p = 0; p < pfs; ++p) {
    const std::string bridge = fmt::format("0000:{:02x}:00.0", 0x10 + p);
    const std::string pf_address = fmt::format("0000:{:02x}:00.0", 0x40 + p);
    fx.AddPci(testing::MakePciSpec(bridge, 0x8086, 0x2030, 0x060400, "pcieport", 10 + 2 * p));
    testing::PciSpec pf =
        testing::MakePciSpec(pf_address, 0x8086, 0x1572, 0x020000, "i40e", 11 + 2 * p);
    pf.parent = bridge;
    fx.AddPci(pf);
    const int count = std::min(kVfsPerPf, devices - p * kVfsPerPf);
    std::vector<testing::PciSpec> vfs;
    for (int i = 0; i < count; ++i) {
      vfs.push_back(testing::MakePciSpec("", 0x8086, 0x154c, 0x020000, "iavf", group++));
    }
    fx.MakeSriovPf(pf_address, count, 0x154c, vfs);
    const std::string net = mem_dir + "/vfnet/" + pf_address;
    std::filesystem::create_directories(net);
    if (!WriteFileAtomically(net + "/netdev", "ens" + std::to_string(p) + "f0\n", 0644).ok()) {
      return false;
    }
    for (int i = 0; i < count; ++i) {
      if (!WriteFileAtomically(
               net + "/vf" + std::to_string(i) + ".json",
               R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false})",
               0644)
               .ok()) {
        return false;
      }
    }
  }
  return true;
}

// Claim i, allocated the plugin's device i.
nlohmann::json Claim(const Options& o, int i) {
  const bool reference = o.plugin == "reference";
  const std::string device =
      reference ? "gpu-" + std::to_string(i)
                : slicepublisher::PciDeviceName(discovery::DeviceKind::kVf, VfAddress(i));
  return {
      {"metadata", {{"namespace", "bench"}, {"name", "c" + std::to_string(i)}, {"uid", Uid(i)}}},
      {"spec", nlohmann::json::object()},
      {"status",
       {{"allocation",
         {{"devices",
           {{"results",
             {{{"request", "dev"},
               {"driver", reference ? kReferenceDriver : "vfio.dra.io"},
               {"pool", "node1"},
               {"device", device}}}}}}}}}}};
}

std::vector<std::string> PluginArgs(const Options& o, const std::string& dir,
                                    const std::string& mem_dir, const std::string& kubeconfig) {
  if (o.plugin == "reference") {
    // The client's rate limit raised, as vfio-dra's claim reads run without one here (its
    // default of 5/s would measure the limit in a round of 32).
    return {o.reference_binary,
            "--node-name=node1",
            "--kubeconfig=" + kubeconfig,
            "--kube-api-qps=1000",
            "--kube-api-burst=1000",
            "--cdi-root=" + mem_dir + "/cdi",
            "--num-devices=" + std::to_string(o.devices),
            "--kubelet-registrar-directory-path=" + dir + "/registry",
            "--kubelet-plugins-directory-path=" + dir + "/plugins"};
  }
  // PEER_BENCH_VFIO_DRA_BINARY: another build of vfio-dra-sim-daemon (a before/after comparison).
  const char* other = std::getenv("PEER_BENCH_VFIO_DRA_BINARY");
  std::vector<std::string> args =
      testing::ServeCommand(other != nullptr && *other != '\0' ? other : VFIO_DRA_SIM_DAEMON_BINARY,
                            kubeconfig, dir + "/registry", dir + "/data", mem_dir);
  for (const char* flag : {"--metrics-address", "127.0.0.1:0", "--claim-api-qps", "0"}) {
    args.emplace_back(flag);
  }
  args.push_back("--simulated-vf-network-dir");
  args.push_back(mem_dir + "/vfnet");
  return args;
}

// Nanoseconds on a CPU of `pid`'s threads now (/proc/PID/task/*/schedstat): finer than
// utime+stime's clock ticks, which an idle plugin's minute holds only a few of; a thread that
// ends in between is lost.
long long ThreadsCpuNs(pid_t pid) {
  long long ns = 0;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "schedstat");
    long long value = 0;
    if (in >> value) ns += value;
  }
  return ns;
}

size_t PublishedDevices(const std::vector<nlohmann::json>& slices) {
  size_t n = 0;
  for (const auto& s : slices) n += s["spec"].value("devices", nlohmann::json::array()).size();
  return n;
}

int Usage(const std::string& problem) {
  std::cerr << "peer_bench: " << problem
            << "\nusage: peer_bench --plugin vfio-dra|reference [--reference-binary PATH] "
               "[--devices N] [--idle-seconds S] [--rounds R] [--dir DIR] [--cdi-base DIR]\n";
  return 2;
}

// Parses the flags into `o`; returns 0, or the exit code after a message.
int Parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage(flag + " needs a value");
    const std::string value = argv[i + 1];
    const auto number = [&](int& to, int most) {
      char* end = nullptr;
      const long parsed = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || parsed < 1 || parsed > most) return false;
      to = static_cast<int>(parsed);
      return true;
    };
    if (flag == "--plugin" && (value == "vfio-dra" || value == "reference")) {
      o.plugin = value;
    } else if (flag == "--reference-binary") {
      o.reference_binary = value;
    } else if (flag == "--dir") {
      o.base = value;
    } else if (flag == "--cdi-base") {
      o.cdi_base = value;
    } else if (!((flag == "--devices" && number(o.devices, 5000)) ||
                 (flag == "--idle-seconds" && number(o.idle_seconds, 3600)) ||
                 (flag == "--rounds" && number(o.rounds, 10000)))) {
      return Usage("bad flag or value: " + flag + " " + value);
    }
  }
  if (o.plugin.empty()) return Usage("--plugin is required");
  if (o.plugin == "reference" && !std::filesystem::exists(o.reference_binary)) {
    return Usage("--plugin reference needs --reference-binary naming the built plugin, not \"" +
                 o.reference_binary + "\" (hack/bench-peer.sh builds it)");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int code = Parse(argc, argv, o); code != 0) return code;
  const std::string dir = MakeTemp(o.base + "/vfio-dra-peer-bench-XXXXXX");
  const std::string mem_dir = MakeTemp(o.cdi_base + "/vfio-dra-peer-bench-node-XXXXXX");
  if (dir.empty() || mem_dir.empty() || !std::filesystem::create_directory(mem_dir + "/cdi")) {
    std::cerr << "peer_bench: cannot make temporary directories under " << o.base << " and "
              << o.cdi_base << "\n";
    return 1;
  }
  if (o.plugin == "vfio-dra" && !BuildVfNode(mem_dir, o.devices)) {
    std::cerr << "peer_bench: cannot write the simulated node under " << mem_dir << "\n";
    return 1;
  }
  testing::FakeApiServerOptions server_options;
  server_options.threads = 4 * kAtOnce;
  const auto started = bench::StartTlsApiServer(dir, server_options, "peer_bench");
  if (started == nullptr) return 1;
  testing::FakeApiServer& server = *started;
  const int claims = std::min(kAtOnce, o.devices);
  for (int i = 0; i < claims; ++i) server.PutClaim(Claim(o, i));
  const std::string kubeconfig = server.WriteKubeconfig(dir);
  std::filesystem::create_directories(dir + "/registry");
  std::filesystem::create_directories(dir + "/plugins");

  const auto t0 = Clock::now();
  // client-go 0.36 starts its informers with a watch that sends the initial objects
  // (WatchListClient), which the fake API server does not serve; with the gate off the reference
  // lists and then watches, as vfio-dra does.
  testing::DaemonProcess plugin_process(PluginArgs(o, dir, mem_dir, kubeconfig),
                                        dir + "/plugin.log",
                                        {"KUBE_FEATURE_WatchListClient=false"});
  size_t published = 0;
  const bool all_published = server.WaitForSlices(
      [&](const std::vector<nlohmann::json>& slices) {
        published = PublishedDevices(slices);
        return published >= static_cast<size_t>(o.devices) &&
               slices.size() == slices.front()["spec"]["pool"]["resourceSliceCount"].get<size_t>();
      },
      std::chrono::seconds(60));
  const double start_to_published_ms = Ms(Clock::now() - t0);
  if (!all_published) {
    std::cerr << "peer_bench: " << o.plugin << " did not publish " << o.devices
              << " devices in 60 s (" << published << " seen)\n"
              << plugin_process.Log();
    return 1;
  }
  testing::KubeletSimulator sim;
  sim.KeepConnections();
  auto socket = sim.WaitForRegistrationSocket(dir + "/registry", std::chrono::seconds(20));
  auto plugin =
      socket.ok() ? sim.Register(*socket) : Result<testing::RegisteredPlugin>(socket.error());
  if (!plugin.ok()) {
    std::cerr << "peer_bench: " << plugin.error().message << "\n" << plugin_process.Log();
    return 1;
  }
  const pid_t pid = plugin_process.pid();

  // Idle: a short settling pause, then the window.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const size_t requests_before_idle = server.Requests().size();
  const double idle_cpu0 = bench::CpuMs(pid);
  const long long idle_ns0 = ThreadsCpuNs(pid);
  const auto idle_t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(o.idle_seconds));
  const double idle_window_s = std::chrono::duration<double>(Clock::now() - idle_t0).count();
  const double idle_cpu_ms = bench::CpuMs(pid) - idle_cpu0;
  const double idle_thread_cpu_ms = static_cast<double>(ThreadsCpuNs(pid) - idle_ns0) / 1e6;
  const double idle_rss_mib = static_cast<double>(bench::StatusKb(pid, "VmRSS")) / 1024.0;
  // What the plugin asked the API server while idle (a watch that ends and is made again, a
  // slice rewritten): "METHOD path -> status" with counts.
  std::map<std::string, int> idle_requests;
  const std::vector<testing::RecordedRequest> requests = server.Requests();
  for (size_t i = requests_before_idle; i < requests.size(); ++i) {
    ++idle_requests[requests[i].method + " " + requests[i].path + " -> " +
                    std::to_string(requests[i].status)];
  }

  std::vector<testing::SimClaim> all;
  for (int i = 0; i < claims; ++i) all.push_back({"bench", "c" + std::to_string(i), Uid(i)});
  std::atomic<int> failures{0};
  std::string first_failure;
  auto prepare = [&](int i) {
    auto r = sim.Prepare(*plugin, {all[static_cast<size_t>(i)]});
    const std::string error = !r.ok() ? r.error().message : r->claims().at(Uid(i)).error();
    if ((!r.ok() || !error.empty()) && failures++ == 0) first_failure = "prepare: " + error;
  };
  auto unprepare_all = [&] {
    auto r = sim.Unprepare(*plugin, all);
    if (!r.ok() && failures++ == 0) first_failure = "unprepare: " + r.error().message;
  };
  // Warm-up: connections to the API server for a round at once.
  (void)bench::AtOnce(claims, prepare);
  unprepare_all();
  std::vector<double> one, many;
  double cpu_ms = 0;
  for (int r = 0; r < o.rounds; ++r) {
    for (int k = 0; k < 4; ++k) {
      const auto c0 = Clock::now();
      prepare(0);
      one.push_back(Ms(Clock::now() - c0));
      unprepare_all();
    }
    const double cpu0 = bench::CpuMs(pid);
    const auto round = bench::AtOnce(claims, prepare);
    unprepare_all();
    cpu_ms += bench::CpuMs(pid) - cpu0;
    many.insert(many.end(), round.begin(), round.end());
  }
  nlohmann::json out = {
      {"plugin", o.plugin},
      {"devices", o.devices},
      {"published_devices", published},
      {"slices", server.Slices().size()},
      {"start_to_published_ms", start_to_published_ms},
      {"idle_window_s", idle_window_s},
      {"idle_cpu_percent_of_a_core", 100.0 * idle_cpu_ms / 1000.0 / idle_window_s},
      {"idle_cpu_percent_of_a_core_schedstat", 100.0 * idle_thread_cpu_ms / 1000.0 / idle_window_s},
      {"idle_rss_mib", idle_rss_mib},
      {"idle_api_requests", idle_requests},
      {"prepare_1", Summary(one)},
      {"prepare_at_once", Summary(many)},
      {"at_once", claims},
      {"cpu_ms_per_claim_prepare_and_unprepare", cpu_ms / (claims * o.rounds)},
      {"failures", failures.load()}};
  if (failures > 0) out["first_failure"] = first_failure;
  std::cout << out.dump(2) << std::endl;
  plugin_process.Signal(SIGTERM);
  plugin_process.WaitForExit(std::chrono::seconds(10));
  server.Stop();
  std::filesystem::remove_all(mem_dir);
  if (std::getenv("PEER_BENCH_KEEP") == nullptr) std::filesystem::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
