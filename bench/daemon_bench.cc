// daemon_bench: the daemon as a node runs it (the real vfio-dra-plugin binary, the fake API server
// on loopback, the kubelet simulator):
//   - time from process start to registered with the kubelet, on the small vm-host node and on a
//     node publishing about 1,000 devices;
//   - RSS and CPU of the idle daemon holding those ~1,000 published devices, measured from /proc
//     over a window that includes periodic checks (CPU in nanoseconds from each thread's
//     schedstat, and in clock ticks from utime+stime).
// Prints JSON.   daemon_bench [--starts N] [--idle-seconds S] [--functions F] [--dir DIR]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "fake_apiserver.h"
#include "integration/daemon_process.h"
#include "kubelet_simulator.h"
#include "latency_summary.h"
#include "process_cpu.h"
#include "sysfs_fixture.h"
#include "tls_apiserver.h"

namespace {

using namespace vfio_dra;  // NOLINT(google-build-using-namespace): a benchmark's main
using Clock = std::chrono::steady_clock;
using bench::CpuTicks;
using bench::Ms;
using bench::Summary;

// The daemon's default unless DAEMON_BENCH_RESCAN says otherwise (to separate its cost).
std::string RescanInterval() {
  const char* value = std::getenv("DAEMON_BENCH_RESCAN");
  return value != nullptr ? value : "30";
}

std::vector<std::string> Args(const std::string& dir, const std::string& kubeconfig) {
  return {VFIO_DRA_PLUGIN_BINARY, "serve",       "--node-name",       "node1",
          "--kubeconfig",         kubeconfig,    "--registrar-dir",   dir + "/registry",
          "--plugin-data-dir",    dir + "/data", "--cdi-dir",         dir + "/cdi",
          "--sysfs-root",         dir + "/sys",  "--dev-root",        dir + "/dev",
          "--metrics-address",    "127.0.0.1:0", "--rescan-interval", RescanInterval()};
}

// Starts the daemon `starts` times on the node in `dir`; returns each start-to-registered time,
// and in `socket_times` when the registration socket appeared.
std::vector<double> StartTimes(const std::string& dir, const std::string& kubeconfig, int starts,
                               std::vector<double>& socket_times) {
  std::vector<double> times;
  for (int i = 0; i < starts; ++i) {
    std::filesystem::remove_all(dir + "/registry");
    std::filesystem::create_directories(dir + "/registry");
    testing::KubeletSimulator sim;
    const auto t0 = Clock::now();
    testing::DaemonProcess daemon(Args(dir, kubeconfig), dir + "/start.log");
    auto socket = sim.WaitForRegistrationSocket(dir + "/registry", std::chrono::seconds(20));
    socket_times.push_back(Ms(Clock::now() - t0));
    auto plugin =
        socket.ok() ? sim.Register(*socket) : Result<testing::RegisteredPlugin>(socket.error());
    const double ms = Ms(Clock::now() - t0);
    if (!plugin.ok()) {
      std::cerr << "daemon_bench: no registration: " << plugin.error().message << "\n"
                << daemon.Log();
      std::exit(1);
    }
    times.push_back(ms);
    daemon.Signal(SIGTERM);
    daemon.WaitForExit(std::chrono::seconds(10));
  }
  return times;
}

struct ThreadCpu {
  std::string name;  // /proc/<pid>/task/<tid>/comm
  long long ns = 0;
};

// Nanoseconds on a CPU of each of `pid`'s threads (/proc/<pid>/task/*/schedstat), by thread id, as
// the cgroup's CPU accounting (what `kubectl top` shows) counts them, not in 10 ms ticks.
std::map<std::string, ThreadCpu> ThreadCpuNs(pid_t pid) {
  std::map<std::string, ThreadCpu> threads;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(task.path() / "schedstat");
    ThreadCpu thread;
    if (!(in >> thread.ns)) continue;
    std::ifstream comm(task.path() / "comm");
    std::getline(comm, thread.name);
    threads[task.path().filename().string()] = thread;
  }
  return threads;
}

// CPU time between two ThreadCpuNs readings by thread name: a thread that started in between
// counts in full (one that ended in between is lost, which only undercounts by what it ran).
std::map<std::string, long long> CpuNsBetween(const std::map<std::string, ThreadCpu>& before,
                                              const std::map<std::string, ThreadCpu>& after) {
  std::map<std::string, long long> by_name;
  for (const auto& [tid, thread] : after) {
    auto it = before.find(tid);
    by_name[thread.name] += thread.ns - (it == before.end() ? 0 : it->second.ns);
  }
  return by_name;
}

// Resident KiB of `pid` per mapped file (by base name), "[heap]", "[stack]" and "[anon]" (every
// other anonymous mapping: thread stacks, malloc arenas, and the .bss of the binary and of each
// library), from /proc/<pid>/smaps: which libraries' pages the idle daemon has touched.
std::map<std::string, long> RssByMapping(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::map<std::string, long> kib;
  if (!in) {
    std::cerr << "daemon_bench: cannot read /proc/" << pid << "/smaps: no RSS per mapping\n";
    return kib;
  }
  std::string current;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    if (first == "Rss:") {
      long value = 0;
      fields >> value;
      kib[current] += value;
    } else if (first.find('-') != std::string::npos && first.back() != ':') {
      // "start-end perms offset dev inode [path]"
      std::string perms, offset, dev, inode, path;
      fields >> perms >> offset >> dev >> inode;
      std::getline(fields >> std::ws, path);  // the rest: a path may hold spaces
      const std::string deleted = " (deleted)";
      if (path.size() > deleted.size() && path.ends_with(deleted)) {
        path.resize(path.size() - deleted.size());
      }
      if (path.empty()) path = "[anon]";
      current = path[0] == '/' ? path.substr(path.rfind('/') + 1) : path;
    }
  }
  return kib;
}

size_t PublishedDevices(const std::vector<nlohmann::json>& slices) {
  size_t n = 0;
  for (const auto& s : slices) n += s["spec"].value("devices", nlohmann::json::array()).size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  int starts = 10;
  int idle_seconds = 60;
  int functions = 1100;
  std::string base = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--starts") == 0) starts = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--idle-seconds") == 0) idle_seconds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--functions") == 0) functions = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--dir") == 0) base = argv[i + 1];
  }
  // As on a node: TLS, verified against the server's CA, with a bearer token; the daemon's
  // footprint includes OpenSSL's handshake and its watch connections' TLS state.
  std::filesystem::create_directories(base);
  testing::FakeApiServerOptions server_options;
  server_options.token = "daemon-bench-token";
  const auto started = bench::StartTlsApiServer(base, server_options, "daemon_bench");
  if (started == nullptr) return 1;
  testing::FakeApiServer& server = *started;
  nlohmann::json out;

  const std::string small = base + "/vfio-dra-daemon-bench-small";
  std::filesystem::remove_all(small);
  testing::BuildFixture("vm-host", small + "/sys");
  const std::string kubeconfig = server.WriteKubeconfig(base);
  std::vector<double> sockets;
  out["start_to_registered_vm_host"] = Summary(StartTimes(small, kubeconfig, starts, sockets));
  out["start_to_socket_vm_host"] = Summary(sockets);

  const std::string large = base + "/vfio-dra-daemon-bench-large";
  std::filesystem::remove_all(large);
  testing::BuildLargeNode(large + "/sys", functions);
  sockets.clear();
  out["start_to_registered_large"] = Summary(StartTimes(large, kubeconfig, starts, sockets));
  out["start_to_socket_large"] = Summary(sockets);

  // The idle daemon: start, wait until every device is published, then watch it do nothing. The
  // starts above left slices behind; a fresh pool makes "all slices present" mean "published".
  server.DeleteSlicesWhere("spec.nodeName=node1");
  std::filesystem::remove_all(large + "/registry");
  std::filesystem::create_directories(large + "/registry");
  testing::DaemonProcess daemon(Args(large, kubeconfig), large + "/idle.log");
  testing::KubeletSimulator sim;
  auto socket = sim.WaitForRegistrationSocket(large + "/registry", std::chrono::seconds(20));
  if (!socket.ok() || !sim.Register(*socket).ok()) {
    std::cerr << "daemon_bench: the idle daemon did not register\n" << daemon.Log();
    return 1;
  }
  size_t published = 0;
  server.WaitForSlices(
      [&](const std::vector<nlohmann::json>& slices) {
        published = PublishedDevices(slices);
        return published > 0 &&
               slices.size() == slices.front()["spec"]["pool"]["resourceSliceCount"].get<size_t>();
      },
      std::chrono::seconds(60));
  const pid_t pid = daemon.pid();
  const long long ticks0 = CpuTicks(pid);
  const auto threads0 = ThreadCpuNs(pid);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(idle_seconds));  // the measurement window
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const long long ticks = CpuTicks(pid) - ticks0;
  const std::map<std::string, long long> cpu_ns_by_thread =
      CpuNsBetween(threads0, ThreadCpuNs(pid));
  long long cpu_ns = 0;
  for (const auto& [name, ns] : cpu_ns_by_thread) cpu_ns += ns;
  out["idle"] = {
      {"published_devices", published},
      {"window_s", seconds},
      {"cpu_percent_of_a_core", 100.0 * static_cast<double>(cpu_ns) / 1e9 / seconds},
      {"cpu_percent_of_a_core_ticks",
       100.0 * static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK)) / seconds},
      {"rss_mib", static_cast<double>(bench::StatusKb(pid, "VmRSS")) / 1024.0},
      {"rss_anon_mib", static_cast<double>(bench::StatusKb(pid, "RssAnon")) / 1024.0},
      {"rss_file_mib", static_cast<double>(bench::StatusKb(pid, "RssFile")) / 1024.0},
      {"peak_rss_mib", static_cast<double>(bench::StatusKb(pid, "VmHWM")) / 1024.0}};
  out["idle_rss_by_mapping_kib"] = RssByMapping(pid);
  // Which threads spend the idle CPU, in microseconds over the window, by thread name.
  for (const auto& [name, ns] : cpu_ns_by_thread) out["idle_cpu_us_by_thread"][name] = ns / 1000;
  daemon.Signal(SIGTERM);
  daemon.WaitForExit(std::chrono::seconds(10));
  server.Stop();
  if (std::getenv("DAEMON_BENCH_KEEP") == nullptr) {
    std::filesystem::remove_all(small);
    std::filesystem::remove_all(large);
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}
