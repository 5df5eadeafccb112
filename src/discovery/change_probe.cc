#include "discovery/change_probe.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <string_view>

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

// Each entry of a directory (no "." / ".."), in the kernel's order: sysfs lists in creation
// order, which is stable while nothing changes, so no sort is needed.
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

void AddFunctions(const sysfs::SysfsReader& sysfs, Digest& digest) {
  const int bus = ::open(sysfs.Path("bus/pci/devices").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (bus < 0) {
    digest.Add("no-pci-bus");
    return;
  }
  char target[512];
  const auto add_link = [&](const std::string& link) {
    const ssize_t n = ::readlinkat(bus, link.c_str(), target, sizeof target);
    digest.Add(n > 0 ? std::string_view(target, static_cast<size_t>(n)) : std::string_view());
  };
  ForEachEntry(bus, [&](std::string_view name) {
    digest.Add(name);
    add_link(std::string(name) + "/driver");
    // The kernel links a new function into its IOMMU group only after the function is listed on
    // the bus (the IOMMU core runs from the bus's add notifier), so a scan can catch a device
    // without its group; the group link must change the digest for the next check to rescan.
    add_link(std::string(name) + "/iommu_group");
  });
  ::close(bus);
}

void AddMdevTypes(const sysfs::SysfsReader& sysfs, Digest& digest) {
  const int parents =
      ::open(sysfs.Path("class/mdev_bus").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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

}  // namespace

uint64_t ProbeDeviceState(const sysfs::SysfsReader& sysfs) {
  Digest digest;
  AddFunctions(sysfs, digest);
  digest.Add("mdev");
  AddMdevTypes(sysfs, digest);
  return digest.value();
}

}  // namespace vfio_dra::discovery
