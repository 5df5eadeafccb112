// The CPU time a benchmarked process has used, from /proc: what daemon_bench reports for the idle
// daemon and prepare_bench per claim.
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

inline double CpuMs(pid_t pid) {
  return static_cast<double>(CpuTicks(pid)) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace vfio_dra::bench
