#include "discovery/change_probe.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <vector>

namespace vfio_dra::discovery {
namespace {

// FNV-1a over the parts, with a separator so that "ab"+"c" and "a"+"bc" differ.
class Digest {
 public:
  void Add(std::string_view part) {
    for (unsigned char c : part) Mix(c);
    Mix(0xff);
  }
  uint64_t value() const { return value_; }

 private:
  void Mix(unsigned char c) {
    value_ ^= c;
    value_ *= 1099511628211ULL;
  }
  uint64_t value_ = 14695981039346656037ULL;
};

// Each entry of a directory (no "." / ".."), in the kernel's order: sysfs lists a directory in a
// fixed order (by a hash of the names), stable while nothing changes, so no sort is needed.
template <typename Fn>
void ForEachEntry(int dir_fd, Fn fn) {
  const int fd = ::dup(dir_fd);
  if (fd < 0) return;
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    ::close(fd);
    return;
  }
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    fn(name);
  }
  ::closedir(dir);
}

int OpenDir(int at, const std::string& path) {
  return ::openat(at, path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int OpenDir(const sysfs::SysfsReader& sysfs, const std::string& path) {
  return ::open(sysfs.Path(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

// A link's target, empty when there is none.
std::string_view ReadLink(int dir_fd, const std::string& link, char (&target)[512]) {
  const ssize_t n = ::readlinkat(dir_fd, link.c_str(), target, sizeof target);
  return n > 0 ? std::string_view(target, static_cast<size_t>(n)) : std::string_view();
}

// Each PCI driver with the functions bound to it (and its fixed attribute files, which never
// change the digest).
void AddDrivers(const sysfs::SysfsReader& sysfs, Digest& digest) {
  const int drivers = OpenDir(sysfs, "bus/pci/drivers");
  if (drivers < 0) {
    digest.Add("no-pci-drivers");
    return;
  }
  ForEachEntry(drivers, [&](std::string_view driver) {
    digest.Add(driver);
    const int dir = OpenDir(drivers, std::string(driver));
    if (dir < 0) return;
    ForEachEntry(dir, [&](std::string_view entry) { digest.Add(entry); });
    ::close(dir);
  });
  ::close(drivers);
}

void AddMdevTypes(const sysfs::SysfsReader& sysfs, Digest& digest) {
  const int parents = OpenDir(sysfs, "class/mdev_bus");
  if (parents < 0) return;  // no mdev parents on this node
  ForEachEntry(parents, [&](std::string_view parent) {
    digest.Add(parent);
    const int types = OpenDir(parents, std::string(parent) + "/mdev_supported_types");
    if (types < 0) return;
    ForEachEntry(types, [&](std::string_view type) {
      digest.Add(type);
      const int type_dir = OpenDir(types, std::string(type));
      if (type_dir < 0) return;
      const int fd = ::openat(type_dir, "available_instances", O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        char text[32];
        const ssize_t n = ::read(fd, text, sizeof text);
        digest.Add(n > 0 ? std::string_view(text, static_cast<size_t>(n)) : std::string_view());
        ::close(fd);
      }
      const int devices = OpenDir(type_dir, "devices");
      if (devices >= 0) {
        ForEachEntry(devices, [&](std::string_view uuid) { digest.Add(uuid); });
        ::close(devices);
      }
      ::close(type_dir);
    });
    ::close(types);
  });
  ::close(parents);
}

// A small attribute's text, read relative to `dir_fd`.
void AddFile(int dir_fd, const char* path, Digest& digest) {
  const int fd = ::openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char text[4096];
  const ssize_t n = ::read(fd, text, sizeof text);
  digest.Add(n > 0 ? std::string_view(text, static_cast<size_t>(n)) : std::string_view());
  ::close(fd);
}

// NVIDIA vGPU VFs (the functions on nvidia with an nvidia/ directory): what each holds and can
// take. Setting a type makes no uevent, and it changes what every sibling lists.
void AddVgpuVfs(const sysfs::SysfsReader& sysfs, Digest& digest) {
  const int driver = OpenDir(sysfs, "bus/pci/drivers/nvidia");
  if (driver < 0) return;
  ForEachEntry(driver, [&](std::string_view entry) {
    const int dir = OpenDir(driver, std::string(entry) + "/nvidia");
    if (dir < 0) return;
    digest.Add(entry);
    AddFile(dir, "current_vgpu_type", digest);
    AddFile(dir, "creatable_vgpu_types", digest);
    ::close(dir);
  });
  ::close(driver);
}

// The health signals device taints come from, which change with no uevent and no change to
// anything else the probe reads: the fatal AER count of each function that has one, and the link
// state of each SR-IOV PF that has VFs (only those links taint anything). Neither takes the device
// lock.
void AddHealth(int bus, const std::vector<std::string>& functions,
               const std::vector<std::string>& pfs, Digest& digest) {
  for (const std::string& name : functions) AddFile(bus, (name + "/aer_dev_fatal").c_str(), digest);
  for (const std::string& pf : pfs) {
    const int net = OpenDir(bus, pf + "/net");
    if (net < 0) continue;
    ForEachEntry(net, [&](std::string_view netdev) {
      digest.Add(netdev);
      AddFile(net, (std::string(netdev) + "/operstate").c_str(), digest);
    });
    ::close(net);
  }
}

}  // namespace

uint64_t ChangeProbe::Probe() {
  Digest digest;
  const int bus = OpenDir(sysfs_, "bus/pci/devices");
  if (bus < 0) {
    digest.Add("no-pci-bus");
  } else {
    std::vector<std::string> functions;
    Digest list;
    ForEachEntry(bus, [&](std::string_view name) {
      list.Add(name);
      functions.emplace_back(name);
    });
    digest.Add(std::to_string(list.value()));
    char target[512];
    if (!listed_ || list.value() != function_list_) {
      // The function list changed: every link is read once, and the functions without a group
      // are remembered for the next probes.
      ungrouped_.clear();
      with_vfs_.clear();
      with_aer_.clear();
      for (const std::string& name : functions) {
        if (ReadLink(bus, name + "/iommu_group", target).empty()) ungrouped_.push_back(name);
        // The kernel gives an AER-capable function its counters when it adds it, and no other
        // function ever gets them: on a node of VFs without AER, reading every function's would
        // be a failed open per VF at every check (most of an idle daemon's probe at 1,000 VFs).
        if (::faccessat(bus, (name + "/aer_dev_fatal").c_str(), F_OK, 0) == 0) {
          with_aer_.push_back(name);
        }
        // A PF gains or loses its VFs only with the function list changing (they are listed).
        if (!ReadLink(bus, name + "/virtfn0", target).empty()) with_vfs_.push_back(name);
      }
      listed_ = true;
      function_list_ = list.value();
    }
    for (const std::string& name : ungrouped_) {
      digest.Add(name);
      digest.Add(ReadLink(bus, name + "/iommu_group", target));
    }
    digest.Add("health");
    AddHealth(bus, with_aer_, with_vfs_, digest);
    ::close(bus);
  }
  digest.Add("drivers");
  AddDrivers(sysfs_, digest);
  digest.Add("mdev");
  AddMdevTypes(sysfs_, digest);
  digest.Add("vgpu-vf");
  AddVgpuVfs(sysfs_, digest);
  return digest.value();
}

}  // namespace vfio_dra::discovery
