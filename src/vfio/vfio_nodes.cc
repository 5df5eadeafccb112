#include "vfio/vfio_nodes.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::vfio {
namespace {

constexpr int64_t kMiscMajor = 10;
constexpr int64_t kVfioMinor = 196;

}  // namespace

Result<std::pair<int64_t, int64_t>> ParseDevNumbers(const std::string& text) {
  std::string trimmed = text;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.pop_back();
  const size_t colon = trimmed.find(':');
  if (colon == std::string::npos) {
    return MakeError(ErrorKind::kInvalidArgument, "not \"major:minor\": \"" + trimmed + "\"");
  }
  auto major = sysfs::ParseDecimalAttribute(trimmed.substr(0, colon));
  auto minor = sysfs::ParseDecimalAttribute(trimmed.substr(colon + 1));
  if (!major.ok() || !minor.ok() || *major < 0 || *minor < 0) {
    return MakeError(ErrorKind::kInvalidArgument, "not \"major:minor\": \"" + trimmed + "\"");
  }
  return std::make_pair(*major, *minor);
}

Status VfioNodes::CheckNode(const CharDeviceNode& node) const {
  const std::string host = dev_root_ + node.path.substr(4);  // path starts with "/dev"
  struct stat st {};
  if (::lstat(host.c_str(), &st) != 0) {
    const int err = errno;
    return MakeError(err == ENOENT ? ErrorKind::kNotFound : ErrorKind::kFailedPrecondition,
                     "device node " + host + " (" + std::to_string(node.major) + ":" +
                         std::to_string(node.minor) + ") is missing: " + ErrnoText(err));
  }
  if (!S_ISCHR(st.st_mode)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "device node " + host + " is not a character device");
  }
  if (static_cast<int64_t>(major(st.st_rdev)) != node.major ||
      static_cast<int64_t>(minor(st.st_rdev)) != node.minor) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "device node " + host + " is " + std::to_string(major(st.st_rdev)) + ":" +
                         std::to_string(minor(st.st_rdev)) + " but sysfs says " +
                         std::to_string(node.major) + ":" + std::to_string(node.minor));
  }
  return Status::Ok();
}

Result<CharDeviceNode> VfioNodes::Verified(const std::string& sysfs_dev_file,
                                           const std::string& dev_path) const {
  auto text = sysfs_.Read(sysfs_dev_file);
  if (!text.ok()) return text.error().Wrap("cannot find the device number of " + dev_path);
  auto numbers = ParseDevNumbers(*text);
  if (!numbers.ok()) return numbers.error().Wrap(sysfs_.Path(sysfs_dev_file));
  CharDeviceNode node{dev_path, numbers->first, numbers->second};
  if (Status s = CheckNode(node); !s.ok()) return s.error();
  return node;
}

Result<CharDeviceNode> VfioNodes::Container() const {
  CharDeviceNode node{"/dev/vfio/vfio", kMiscMajor, kVfioMinor};
  if (Status s = CheckNode(node); !s.ok()) {
    return s.error().Wrap("the VFIO container node is unusable (is the vfio module loaded?)");
  }
  return node;
}

Result<CharDeviceNode> VfioNodes::Group(int group) const {
  const std::string number = std::to_string(group);
  // A no-IOMMU group (vfio.enable_unsafe_noiommu_mode) has its own node name. The group's
  // `name` does not tell: mdevs' emulated-IOMMU groups are named vfio-noiommu too, yet their
  // node is /dev/vfio/<group>. The vfio class device is what the kernel actually created.
  std::string name = number;
  if (!sysfs_.Exists("class/vfio/" + number) && sysfs_.Exists("class/vfio/noiommu-" + number)) {
    name = "noiommu-" + number;
  }
  return Verified("class/vfio/" + name + "/dev", "/dev/vfio/" + name);
}

Result<std::vector<CharDeviceNode>> VfioNodes::DeviceCdevs(const std::string& device_dir) const {
  std::vector<CharDeviceNode> nodes;
  const std::string dir = device_dir + "/vfio-dev";
  auto entries = sysfs_.List(dir);
  if (!entries.ok()) {
    if (entries.error().kind == ErrorKind::kNotFound) return nodes;
    return entries.error();
  }
  for (const std::string& entry : *entries) {
    if (entry.rfind("vfio", 0) != 0) continue;
    auto node = Verified(dir + "/" + entry + "/dev", "/dev/vfio/devices/" + entry);
    if (!node.ok()) return node.error();
    nodes.push_back(*node);
  }
  return nodes;
}

Result<CharDeviceNode> VfioNodes::Iommufd() const {
  if (!sysfs_.Exists("class/misc/iommu/dev")) {
    return MakeError(ErrorKind::kNotFound, "iommufd is not available on this node (no " +
                                               sysfs_.Path("class/misc/iommu") + ")");
  }
  return Verified("class/misc/iommu/dev", "/dev/iommu");
}

}  // namespace vfio_dra::vfio
