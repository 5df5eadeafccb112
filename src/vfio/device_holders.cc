#include "vfio/device_holders.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace vfio_dra::vfio {
namespace {

bool IsPid(const char* name) {
  if (*name == '\0') return false;
  for (const char* c = name; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  return true;
}

bool HoldsAny(const std::string& fd_dir, const std::vector<dev_t>& devices) {
  DIR* dir = ::opendir(fd_dir.c_str());
  if (dir == nullptr) return false;
  bool found = false;
  while (const dirent* entry = ::readdir(dir)) {
    if (!IsPid(entry->d_name)) continue;  // descriptor numbers are digits too
    struct stat st {};
    if (::stat((fd_dir + "/" + entry->d_name).c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) {
      continue;
    }
    if (std::find(devices.begin(), devices.end(), st.st_rdev) != devices.end()) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

}  // namespace

std::vector<DeviceHolder> FindDeviceHolders(const std::string& proc_root,
                                            const std::vector<dev_t>& devices) {
  std::vector<DeviceHolder> out;
  if (devices.empty()) return out;
  DIR* proc = ::opendir(proc_root.c_str());
  if (proc == nullptr) return out;
  while (const dirent* entry = ::readdir(proc)) {
    if (!IsPid(entry->d_name)) continue;
    const std::string base = proc_root + "/" + entry->d_name;
    if (!HoldsAny(base + "/fd", devices)) continue;
    DeviceHolder holder;
    holder.pid = std::atoi(entry->d_name);
    std::ifstream comm(base + "/comm");
    std::getline(comm, holder.command);
    out.push_back(std::move(holder));
  }
  ::closedir(proc);
  std::sort(out.begin(), out.end(),
            [](const DeviceHolder& a, const DeviceHolder& b) { return a.pid < b.pid; });
  return out;
}

std::string DescribeHolders(const std::vector<DeviceHolder>& holders) {
  if (holders.empty()) return "no process in this PID namespace holds its /dev/vfio nodes";
  std::string out = "held by ";
  for (size_t i = 0; i < holders.size(); ++i) {
    if (i > 0) out += ", ";
    out += "pid " + std::to_string(holders[i].pid) + " (" + holders[i].command + ")";
  }
  return out;
}

}  // namespace vfio_dra::vfio
