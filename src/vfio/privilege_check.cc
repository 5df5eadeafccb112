#include "vfio/privilege_check.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <sstream>

#include "base/file_io.h"

namespace vfio_dra::vfio {
namespace {

// PCI base class 0x02: network controllers, whose VFs' settings a claim may set.
constexpr uint32_t kNetworkClass = 0x02;

constexpr const char* kGrantSysfs =
    "mount the host's /sys read-write and load the AppArmor profile "
    "deploy/apparmor/vfio-dra-plugin (or run Unconfined)";
constexpr const char* kGrantDev =
    "mount the host's /dev at --dev-root and load the AppArmor profile "
    "deploy/apparmor/vfio-dra-plugin (or run Unconfined)";
constexpr const char* kGrantNetwork =
    "grant it with the Helm value sriovNetwork.enabled=true (hostNetwork and NET_ADMIN)";
constexpr const char* kGrantHostNetns =
    "drop --host-netns and set the Helm value sriovNetwork.enabled=true (hostNetwork and "
    "NET_ADMIN), or grant the capability with --host-netns kept";
constexpr const char* kGrantHolders =
    "grant it with the Helm value deviceHolders.enabled=true (hostPID and SYS_PTRACE)";

struct FeatureText {
  const char* name;   // for labels and JSON
  const char* words;  // for the message
};

FeatureText TextOf(PrivilegedFeature feature) {
  switch (feature) {
    case PrivilegedFeature::kPciPassthrough:
      return {"pci-passthrough", "PCI passthrough (binding devices to their VFIO driver)"};
    case PrivilegedFeature::kMdev:
      return {"mdev", "mediated devices (mdev create and remove)"};
    case PrivilegedFeature::kVgpuVf:
      return {"vgpu-vf", "NVIDIA vGPUs on SR-IOV VFs (nvidia/current_vgpu_type)"};
    case PrivilegedFeature::kDeviceNodes:
      return {"device-nodes", "handing VFIO device nodes to VMs"};
    case PrivilegedFeature::kVfNetwork:
      return {"vf-network", "VF network settings (MAC, VLAN, trust)"};
    case PrivilegedFeature::kHolderNaming:
      return {"device-holders", "naming the processes that hold a busy device"};
  }
  return {"?", "?"};
}

bool Has(uint64_t caps, int cap) { return (caps >> cap) & 1U; }

std::string CapabilityAbsent(uint64_t caps) {
  char hex[20];
  (void)std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(caps));
  return std::string("the capability is not in the plugin's effective set (CapEff ") + hex + ")";
}

// The first attribute of `paths` the process cannot open for writing.
std::optional<MissingPrivilege> ProbeSysfs(PrivilegedFeature feature,
                                           const std::vector<std::string>& paths,
                                           const sysfs::SysfsReader& sysfs,
                                           sysfs::SysfsWriter& writer) {
  for (const std::string& relative : paths) {
    const std::string path = sysfs.Path(relative);
    const int err = writer.ProbeWritable(path);
    if (err == 0 || err == ENOENT) continue;
    return MissingPrivilege{"write access to " + path, feature,
                            "opening it for writing failed: " + ErrnoText(err), kGrantSysfs};
  }
  return std::nullopt;
}

// The directory of /dev/vfio nodes, when VFIO is loaded (otherwise the missing driver is
// reported by the prepare that needs it). Prepare only stats the nodes it hands out (it never
// lists or opens them), so this stats their directory, as they are reached.
std::optional<MissingPrivilege> CheckDeviceNodes(const sysfs::SysfsReader& sysfs,
                                                 const std::string& dev_root) {
  const std::string dir = dev_root + "/vfio";
  struct stat st {};
  const int err = ::stat(dir.c_str(), &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (err == 0) return std::nullopt;
  if (err == ENOENT && !sysfs.Exists("class/misc/vfio") &&
      !sysfs.Exists("bus/pci/drivers/vfio-pci")) {
    return std::nullopt;
  }
  return MissingPrivilege{"access to " + dir, PrivilegedFeature::kDeviceNodes,
                          "stat of it failed: " + ErrnoText(err), kGrantDev};
}

bool OtherProcessNamespace(const std::string& path) {
  return path.rfind("/proc/", 0) == 0 && path.rfind("/proc/self/", 0) != 0 &&
         path.rfind("/proc/thread-self/", 0) != 0;
}

void CheckVfNetwork(uint64_t caps, const PrivilegeCheckOptions& options,
                    std::vector<MissingPrivilege>& out) {
  const PrivilegedFeature feature = PrivilegedFeature::kVfNetwork;
  if (!Has(caps, CAP_NET_ADMIN)) {
    out.push_back({"CAP_NET_ADMIN", feature, CapabilityAbsent(caps), kGrantNetwork});
  }
  if (options.host_netns.empty()) return;
  const std::string& netns = options.host_netns;
  if (!Has(caps, CAP_SYS_ADMIN)) {
    out.push_back({"CAP_SYS_ADMIN", feature,
                   CapabilityAbsent(caps) + "; setns(2) into --host-netns " + netns + " needs it",
                   kGrantHostNetns});
  }
  if (OtherProcessNamespace(netns) && !Has(caps, CAP_SYS_PTRACE)) {
    out.push_back({"CAP_SYS_PTRACE", feature,
                   CapabilityAbsent(caps) + "; opening --host-netns " + netns +
                       " (another process's namespace) needs it",
                   kGrantHostNetns});
    return;
  }
  const int fd = ::open(netns.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  out.push_back({"access to the network namespace " + netns, feature,
                 "opening it failed: " + ErrnoText(errno) +
                     " (/proc/1/ns/net is the host's only with hostPID: true)",
                 kGrantHostNetns});
}

}  // namespace

const char* PrivilegedFeatureName(PrivilegedFeature feature) { return TextOf(feature).name; }

std::string MissingPrivilege::Line() const {
  return "privilege missing: " + privilege + " for " + TextOf(feature).words + ": " + error + "; " +
         grant;
}

PrivilegeNeeds PrivilegeNeedsOf(const discovery::Inventory& inventory,
                                const discovery::DeviceSelection& selection) {
  PrivilegeNeeds needs;
  if (!selection.devices.empty()) {
    std::vector<std::string>& paths = needs.features[PrivilegedFeature::kPciPassthrough];
    const std::string& address = selection.devices.front().address;
    paths.push_back("bus/pci/devices/" + address + "/driver_override");
    if (const discovery::PciFunction* fn = inventory.Find(address)) {
      if (!fn->driver.empty() && !fn->bound_by_vfio_dra && fn->driver != fn->vfio_driver.driver) {
        paths.push_back("bus/pci/drivers/" + fn->driver + "/unbind");
      }
      if (fn->vfio_driver.loaded) {
        paths.push_back("bus/pci/drivers/" + fn->vfio_driver.driver + "/bind");
      }
    }
  }
  if (!selection.mdev_types.empty()) {
    const discovery::SelectedMdevType& type = selection.mdev_types.front();
    needs.features[PrivilegedFeature::kMdev].push_back(
        "class/mdev_bus/" + type.parent + "/mdev_supported_types/" + type.type_id + "/create");
  }
  if (!selection.vgpu_vfs.empty()) {
    needs.features[PrivilegedFeature::kVgpuVf].push_back(
        "bus/pci/devices/" + selection.vgpu_vfs.front().address + "/nvidia/current_vgpu_type");
  }
  if (!needs.features.empty()) {
    needs.features[PrivilegedFeature::kDeviceNodes];
    needs.features[PrivilegedFeature::kHolderNaming];
  }
  for (const discovery::SelectedDevice& device : selection.devices) {
    const discovery::PciFunction* fn = inventory.Find(device.address);
    if (fn != nullptr && fn->sriov_vf && fn->BaseClass() == kNetworkClass) {
      needs.features[PrivilegedFeature::kVfNetwork];
      break;
    }
  }
  return needs;
}

std::vector<MissingPrivilege> CheckPrivileges(const PrivilegeNeeds& needs,
                                              const sysfs::SysfsReader& sysfs,
                                              sysfs::SysfsWriter& writer,
                                              const PrivilegeCheckOptions& options) {
  std::vector<MissingPrivilege> out;
  // Unreadable capabilities count as none: what needs one is then reported, not assumed.
  auto read_caps = ReadEffectiveCapabilities(options.process_status);
  const uint64_t caps = read_caps.ok() ? *read_caps : 0;
  for (const auto& [feature, paths] : needs.features) {
    switch (feature) {
      case PrivilegedFeature::kPciPassthrough:
      case PrivilegedFeature::kMdev:
      case PrivilegedFeature::kVgpuVf:
        if (auto missing = ProbeSysfs(feature, paths, sysfs, writer)) out.push_back(*missing);
        break;
      case PrivilegedFeature::kDeviceNodes:
        if (auto missing = CheckDeviceNodes(sysfs, options.dev_root)) out.push_back(*missing);
        break;
      case PrivilegedFeature::kVfNetwork:
        if (options.vf_network_in_kernel) CheckVfNetwork(caps, options, out);
        break;
      case PrivilegedFeature::kHolderNaming:
        if (!Has(caps, CAP_SYS_PTRACE)) {
          out.push_back({"CAP_SYS_PTRACE", feature,
                         CapabilityAbsent(caps) +
                             "; /proc/<pid>/fd of other users' processes (KubeVirt's VMM runs as "
                             "uid 107) cannot be read, so a busy device's holders may go unnamed",
                         kGrantHolders});
        }
        break;
    }
  }
  return out;
}

const MissingPrivilege* FindMissing(const std::vector<MissingPrivilege>& missing,
                                    PrivilegedFeature feature) {
  for (const MissingPrivilege& m : missing) {
    if (m.feature == feature) return &m;
  }
  return nullptr;
}

Result<uint64_t> ReadEffectiveCapabilities(const std::string& process_status) {
  auto text = ReadFileToString(process_status, size_t{64} * 1024);
  if (!text.ok()) return text.error();
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    unsigned long long value = 0;
    if (std::sscanf(line.c_str() + 7, "%llx", &value) != 1) break;
    return static_cast<uint64_t>(value);
  }
  return MakeError(ErrorKind::kInvalidArgument,
                   process_status + " has no readable CapEff line (the effective capabilities)");
}

std::optional<std::string> HolderNamingGap(const std::string& process_status) {
  auto caps = ReadEffectiveCapabilities(process_status);
  if (caps.ok() && Has(*caps, CAP_SYS_PTRACE)) return std::nullopt;
  return std::string(
             "holders may be unnamed: without CAP_SYS_PTRACE the plugin cannot read "
             "/proc/<pid>/fd of other users' processes (KubeVirt's VMM runs as uid 107); ") +
         kGrantHolders;
}

}  // namespace vfio_dra::vfio
