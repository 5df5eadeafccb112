// prepare_bench: NodePrepareResources latency of one-device claims through the daemon's gRPC
// socket (vfio-dra-sim-daemon: the real daemon with the simulated kernel), the fake API server on
// loopback over TLS, with 1, 8, 32 and 128 pods at once; and, in the same run, the floor: the same
// atomic file writes, as durable as the daemon makes them, plus one claim GET, done directly, at 1
// and
// 32. Prints JSON.
//   prepare_bench [--rounds N] [--dir DIR] [--cdi-base DIR] [--daemon-fsync on|off]
//                 [--apiserver-keepalive-poll stretched|packaged]
// DIR holds the plugin data dir (checkpoint, metadata files; default /tmp); the CDI specs and the
// simulated sysfs and /dev go under --cdi-base, by default /dev/shm: /var/run/cdi is a tmpfs on
// nodes, and sysfs and devtmpfs live in memory. `--daemon-fsync off` is a diagnostic: the daemon
// runs with fsync and fdatasync made no-ops (bench/no_fsync_preload.cc), the floor keeps them, so
// the ratio then shows what the daemon's work other than durability costs against the floor.
// The fake API server runs in this process on the packaged cpp-httplib, which polls every idle
// kept-alive connection every 10 ms; an API server does not, and on two cores those wakeups take
// CPU from whichever side is busy. By default this process re-executes itself with
// bench/keepalive_poll_preload.cc preloaded, which stretches that poll to a second;
// `--apiserver-keepalive-poll packaged` measures with the polling as packaged.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/directory_sync.h"
#include "base/file_io.h"
#include "base/thread_name.h"
#include "discovery/inventory.h"
#include "fake_apiserver.h"
#include "integration/daemon_process.h"
#include "kube/api_client.h"
#include "kube/client_config.h"
#include "kube/httplib_transport.h"
#include "kube/token_source.h"
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
constexpr int kPods = 128;  // the most pods at once that are measured

std::string Uid(int i) {
  char buffer[40];
  (void)std::snprintf(buffer, sizeof buffer, "b0000000-0000-4000-8000-%012d", i);
  return buffer;
}

// Runs `one(i)` for i in [0, pods) at once, `rounds` times; `between` runs untimed after each
// round. Returns every call's latency.
template <typename One, typename Between>
std::vector<double> Measure(int pods, int rounds, One one, Between between) {
  std::vector<double> samples;
  for (int r = 0; r < rounds; ++r) {
    const std::vector<double> round = bench::AtOnce(pods, one);
    samples.insert(samples.end(), round.begin(), round.end());
    between();
  }
  return samples;
}

// Defined by bench/keepalive_poll_preload.cc.
constexpr const char* kKeepAlivePollShimSymbol = "vfio_dra_keepalive_poll_stretched";
// Set when this process re-executed itself with the shim, so that it does so once.
constexpr const char* kReexecutedVariable = "VFIO_DRA_PREPARE_BENCH_REEXECUTED";

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20;
  std::string base = "/tmp";
  std::string cdi_base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  bool daemon_fsync = true;
  bool stretched_keepalive_poll = true;
  const auto usage = [](const std::string& problem) {
    std::cerr << "prepare_bench: " << problem
              << "\nusage: prepare_bench [--rounds N] [--dir DIR] [--cdi-base DIR] "
                 "[--daemon-fsync on|off] [--apiserver-keepalive-poll stretched|packaged]\n";
    return 2;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      usage("measures prepare latency against the floor (see the header of prepare_bench.cc)");
      return 0;
    }
    if (i + 1 >= argc) return usage(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--rounds") {
      char* end = nullptr;
      const long parsed = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || parsed < 1 || parsed > 100000) {
        return usage("--rounds takes a whole number from 1 to 100000, not \"" + value + "\"");
      }
      rounds = static_cast<int>(parsed);
    } else if (flag == "--dir") {
      base = value;
    } else if (flag == "--cdi-base") {
      cdi_base = value;
    } else if (flag == "--daemon-fsync") {
      if (value != "on" && value != "off") {
        return usage("--daemon-fsync takes on or off, not \"" + value + "\"");
      }
      daemon_fsync = value == "on";
    } else if (flag == "--apiserver-keepalive-poll") {
      if (value != "stretched" && value != "packaged") {
        return usage("--apiserver-keepalive-poll takes stretched or packaged, not \"" + value +
                     "\"");
      }
      stretched_keepalive_poll = value == "stretched";
    } else {
      return usage("unknown flag \"" + flag + "\"");
    }
  }
  // The fake API server's polling is this process's own: the preload has to be in place before
  // it starts, so the process starts again with it, once. The shim says it is loaded through a
  // symbol, so a preload the loader ignored (a moved build, a secure-execution process) fails
  // here instead of being reported as in effect.
  NameThisThread("prepare_bench");  // not "exe", after the re-execution
  const bool shim_loaded = dlsym(RTLD_DEFAULT, kKeepAlivePollShimSymbol) != nullptr;
  if (stretched_keepalive_poll && !shim_loaded) {
    if (std::getenv(kReexecutedVariable) != nullptr) {
      std::cerr << "prepare_bench: " << VFIO_DRA_KEEPALIVE_POLL_PRELOAD
                << " is in LD_PRELOAD but was not loaded (is the build there?); "
                   "--apiserver-keepalive-poll packaged measures without it\n";
      return 1;
    }
    const char* preloaded = std::getenv("LD_PRELOAD");
    const std::string preload = (preloaded != nullptr && *preloaded != '\0')
                                    ? std::string(preloaded) + ":" + VFIO_DRA_KEEPALIVE_POLL_PRELOAD
                                    : std::string(VFIO_DRA_KEEPALIVE_POLL_PRELOAD);
    ::setenv("LD_PRELOAD", preload.c_str(), 1);
    ::setenv(kReexecutedVariable, "1", 1);
    ::execv("/proc/self/exe", argv);
    std::cerr << "prepare_bench: cannot start again with " << VFIO_DRA_KEEPALIVE_POLL_PRELOAD
              << " preloaded: " << std::strerror(errno)
              << " (--apiserver-keepalive-poll packaged measures without it)\n";
    return 1;
  }
  if (!stretched_keepalive_poll && shim_loaded) {
    std::cerr << "prepare_bench: --apiserver-keepalive-poll packaged, but "
              << VFIO_DRA_KEEPALIVE_POLL_PRELOAD << " is preloaded; start it without\n";
    return 2;
  }
  const std::string tmpl_text = base + "/vfio-dra-prepare-bench-XXXXXX";
  std::vector<char> tmpl(tmpl_text.begin(), tmpl_text.end());
  tmpl.push_back('\0');
  const std::string dir = mkdtemp(tmpl.data());
  const std::string cdi_tmpl_text = cdi_base + "/vfio-dra-prepare-bench-cdi-XXXXXX";
  std::vector<char> cdi_tmpl(cdi_tmpl_text.begin(), cdi_tmpl_text.end());
  cdi_tmpl.push_back('\0');
  const std::string cdi_dir = mkdtemp(cdi_tmpl.data());
  // sysfs and /dev are memory file systems on a node: the simulated ones live in memory too, so
  // that the simulation's own file work does not stand in for the kernel's.
  const std::string mem_tmpl_text = cdi_base + "/vfio-dra-prepare-bench-node-XXXXXX";
  std::vector<char> mem_tmpl(mem_tmpl_text.begin(), mem_tmpl_text.end());
  mem_tmpl.push_back('\0');
  const std::string mem_dir = mkdtemp(mem_tmpl.data());

  // A node with one PF and 128 VFs, each VF in its own group: one-device claims bind one function.
  testing::SysfsFixture fx(mem_dir + "/sys");
  fx.AddPci(testing::MakePciSpec("0000:5d:00.0", 0x8086, 0x2030, 0x060400, "pcieport", 49));
  testing::PciSpec pf = testing::MakePciSpec("0000:5e:00.0", 0x8086, 0x1572, 0x020000, "i40e", 50);
  pf.parent = "0000:5d:00.0";
  fx.AddPci(pf);
  std::vector<testing::PciSpec> vfs;
  vfs.reserve(kPods);
  for (int i = 0; i < kPods; ++i) {
    vfs.push_back(testing::MakePciSpec("", 0x8086, 0x154c, 0x020000, "iavf", 200 + i));
  }
  fx.MakeSriovPf("0000:5e:00.0", kPods, 0x154c, vfs);
  // The PF's network interface and its VFs' settings, as its driver keeps them (the simulated
  // driver, see vfio::MakeFileVfNetwork) and as a fresh PF has them (no MAC assigned): on a node a
  // VF's PF has a netdev, so every prepare reads the VF's settings, and none logs that it cannot.
  const std::string vf_network_dir = mem_dir + "/vfnet";
  std::filesystem::create_directories(vf_network_dir + "/0000:5e:00.0");
  bool vf_network_written =
      WriteFileAtomically(vf_network_dir + "/0000:5e:00.0/netdev", "ens5f0\n", 0644).ok();
  for (int i = 0; i < kPods && vf_network_written; ++i) {
    vf_network_written =
        WriteFileAtomically(
            vf_network_dir + "/0000:5e:00.0/vf" + std::to_string(i) + ".json",
            R"({"mac":"00:00:00:00:00:00","vlan":0,"qos":0,"spoofchk":true,"trust":false})", 0644)
            .ok();
  }
  if (!vf_network_written) {
    std::cerr << "prepare_bench: cannot write the simulated VF settings under " << vf_network_dir
              << "\n";
    return 1;
  }

  // As on a node, the daemon reads claims over TLS, verified against the server's CA.
  testing::FakeApiServerOptions server_options;
  // The daemon's connections and the floor's, kept alive, each hold a server thread: as many as
  // the widest round, twice, as an API server serves thousands.
  server_options.threads = 4 * kPods;
  const auto started = bench::StartTlsApiServer(dir, server_options, "prepare_bench");
  if (started == nullptr) return 1;
  testing::FakeApiServer& server = *started;
  for (int i = 0; i < kPods; ++i) {
    const int devfn = 16 + i;
    char address[16];
    (void)std::snprintf(address, sizeof address, "0000:5e:%02x.%x", devfn >> 3, devfn & 7);
    server.PutClaim(
        {{"metadata", {{"namespace", "bench"}, {"name", "c" + std::to_string(i)}, {"uid", Uid(i)}}},
         {"spec", nlohmann::json::object()},
         {"status",
          {{"allocation",
            {{"devices",
              {{"results",
                {{{"request", "nic"},
                  {"driver", "vfio.dra.io"},
                  {"pool", "node1"},
                  {"device",
                   slicepublisher::PciDeviceName(discovery::DeviceKind::kVf, address)}}}}}}}}}}});
  }
  const std::string kubeconfig = server.WriteKubeconfig(dir);
  std::filesystem::create_directories(dir + "/registry");
  testing::DaemonProcess daemon(
      {VFIO_DRA_SIM_DAEMON_BINARY, "serve", "--node-name", "node1", "--kubeconfig", kubeconfig,
       "--registrar-dir", dir + "/registry", "--plugin-data-dir", dir + "/data", "--cdi-dir",
       cdi_dir, "--sysfs-root", mem_dir + "/sys", "--dev-root", mem_dir + "/dev",
       "--metrics-address", "127.0.0.1:0", "--simulated-vf-network-dir", vf_network_dir,
       // Off, as for the publish figures: rounds of claims follow each other back to back here,
       // far faster than pods start on a node, and would measure the limit (50/s after a burst
       // of 100) instead of the daemon. One round of 32 is within the default burst.
       "--claim-api-qps", "0"},
      dir + "/daemon.log",
      // The daemon gets no preload of this process's (an empty LD_PRELOAD replaces it).
      std::vector<std::string>{std::string("LD_PRELOAD=") +
                               (daemon_fsync ? "" : VFIO_DRA_NO_FSYNC_PRELOAD)});
  testing::KubeletSimulator sim;
  sim.KeepConnections();  // as the kubelet does (one connection per plugin)
  auto socket = sim.WaitForRegistrationSocket(dir + "/registry", std::chrono::seconds(20));
  if (!socket.ok()) {
    std::cerr << "prepare_bench: " << socket.error().message << "\n" << daemon.Log();
    return 1;
  }
  auto plugin = sim.Register(*socket);
  if (!plugin.ok()) {
    std::cerr << "prepare_bench: " << plugin.error().message << "\n";
    return 1;
  }
  server.WaitForSlices([](const auto& slices) { return !slices.empty(); },
                       std::chrono::seconds(20));
  std::vector<testing::SimClaim> all;
  all.reserve(kPods);
  for (int i = 0; i < kPods; ++i) all.push_back({"bench", "c" + std::to_string(i), Uid(i)});
  std::atomic<int> failures{0};
  auto prepare = [&](int i) {
    auto r = sim.Prepare(*plugin, {all[static_cast<size_t>(i)]});
    if (!r.ok() || !r->claims().at(Uid(i)).error().empty()) {
      if (failures++ == 0) {
        std::cerr << "prepare failed: "
                  << (r.ok() ? r->claims().at(Uid(i)).error() : r.error().message) << "\n";
      }
    }
  };
  auto unprepare_all = [&] {
    auto r = sim.Unprepare(*plugin, all);
    if (!r.ok()) ++failures;
  };
  // The floor: what one prepare cannot avoid, at the durability it needs: the claim GET, two
  // checkpoint records made durable (the data fsynced, the directory fsync shared by writers that
  // finish together, as the daemon does), and three atomic files that need no fsync (the metadata
  // file in the data dir; the CDI spec and the metadata's CDI spec in the CDI dir).
  auto config = kube::LoadKubeconfigFile(kubeconfig);
  auto transport = kube::HttplibTransport::Create(*config, "bench");
  kube::TokenSource tokens("", "", RealClock());
  kube::ApiClientOptions api_options;
  api_options.qps = 0;
  kube::ApiClient api(**transport, tokens, RealClock(), Logger::Discard(), api_options);
  std::filesystem::create_directories(dir + "/floor");
  GroupDirectorySync floor_sync(dir + "/floor");
  const std::string spec(600, 'x');
  auto floor_one = [&](int i) {
    auto claim =
        api.Get("/apis/resource.k8s.io/v1/namespaces/bench/resourceclaims/c" + std::to_string(i));
    if (!claim.ok()) ++failures;
    for (int f = 0; f < 5; ++f) {
      const std::string path = (f < 3 ? dir + "/floor/" : cdi_dir + "/floor-") + std::to_string(i) +
                               "-" + std::to_string(f) + ".json";
      const bool record = f < 2;
      if (!WriteFileAtomically(path, spec, 0644,
                               record ? Durability::kDataOnly : Durability::kVolatile)
               .ok() ||
          (record && !floor_sync.Sync().ok())) {
        ++failures;
      }
    }
  };
  // Warm up: the first publish, and as many kept-alive TLS connections to the API server, the
  // daemon's and the floor's, as a round of 32 needs at once, so that the rounds compared measure
  // a node that prepares pods from time to time (a burst after minutes of quiet pays a handshake
  // per claim read, on both sides; the first round of 128 pays its extra ones).
  (void)Measure(32, 1, prepare, unprepare_all);
  (void)Measure(32, 1, floor_one, [] {});
  // The disk's speed drifts over minutes on a shared machine: each round of the prepares is run
  // next to a round of the floor, so that the two are compared under the same conditions.
  std::vector<double> one_pod, floor_single, eight_pods, many_pods, floor_many;
  // CPU time in the rounds of 32: the daemon's to prepare and to unprepare, and this process's
  // (the kubelet's side of the calls and the API server's answers, or the floor's own work).
  double prepare_cpu_ms = 0, unprepare_cpu_ms = 0, client_prepare_cpu_ms = 0, floor_cpu_ms = 0;
  const auto append = [](std::vector<double>& to, const std::vector<double>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  for (int r = 0; r < rounds; ++r) {
    append(floor_single, Measure(
                             1, 4, [&](int) { floor_one(0); }, [] {}));
    append(one_pod, Measure(
                        1, 4, [&](int) { prepare(0); }, unprepare_all));
    append(eight_pods, Measure(8, 1, prepare, unprepare_all));
    const double floor_before = bench::CpuMs(getpid());
    append(floor_many, Measure(32, 1, floor_one, [] {}));
    floor_cpu_ms += bench::CpuMs(getpid()) - floor_before;
    const double daemon_before = bench::CpuMs(daemon.pid());
    const double client_before = bench::CpuMs(getpid());
    append(many_pods, Measure(32, 1, prepare, [] {}));
    const double daemon_prepared = bench::CpuMs(daemon.pid());
    client_prepare_cpu_ms += bench::CpuMs(getpid()) - client_before;
    prepare_cpu_ms += daemon_prepared - daemon_before;
    unprepare_all();
    unprepare_cpu_ms += bench::CpuMs(daemon.pid()) - daemon_prepared;
  }
  auto most_pods = Measure(kPods, std::max(1, rounds / 4), prepare, unprepare_all);

  nlohmann::json out = {
      {"data_dir", dir},
      {"daemon_fsync", daemon_fsync},
      {"apiserver_keepalive_poll_ms", stretched_keepalive_poll ? 1000 : 10},
      {"cdi_dir", cdi_dir},
      {"prepare_1_pod", Summary(one_pod)},
      {"prepare_8_pods", Summary(eight_pods)},
      {"prepare_32_pods", Summary(many_pods)},
      {"prepare_128_pods", Summary(most_pods)},
      {"floor_1_pod", Summary(floor_single)},
      {"floor_32_pods", Summary(floor_many)},
      // CPU time per claim, 32 at once (see above).
      {"daemon_cpu_ms_per_prepare_32_pods", prepare_cpu_ms / (32.0 * rounds)},
      {"daemon_cpu_ms_per_unprepare_32_pods", unprepare_cpu_ms / (32.0 * rounds)},
      {"client_cpu_ms_per_prepare_32_pods", client_prepare_cpu_ms / (32.0 * rounds)},
      {"floor_cpu_ms_per_claim_32_pods", floor_cpu_ms / (32.0 * rounds)},
      {"failures", failures.load()}};
  std::cout << out.dump(2) << std::endl;
  daemon.Signal(SIGTERM);
  daemon.WaitForExit(std::chrono::seconds(10));
  server.Stop();
  std::filesystem::remove_all(cdi_dir);
  std::filesystem::remove_all(mem_dir);
  if (std::getenv("PREPARE_BENCH_KEEP") == nullptr) std::filesystem::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
