// The CPU time a benchmarked process has used, and its memory, from /proc: what daemon_bench and
// peer_bench report for the idle daemon and prepare_bench per claim.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace vfio_dra::bench {

// utime + stime of `pid` and its exited threads, in clock ticks.
inline long long CpuTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  // The fields after the command name (which may hold spaces) start with the state, field 3.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string value;
  long long ticks = 0;
  for (int i = 3; fields >> value; ++i) {
    if (i == 14 || i == 15) ticks += std::stoll(value);
    if (i == 15) break;
  }
  return ticks;
}

// A "Field:" value of /proc/<pid>/status in KiB (VmRSS, VmHWM, ...); -1 when absent.
inline long StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

inline double CpuMs(pid_t pid) {
  return static_cast<double>(CpuTicks(pid)) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace vfio_dra::bench
