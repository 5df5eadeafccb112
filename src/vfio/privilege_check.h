// PrivilegeCheck: what this process lacks for the features the node's devices enable, found
// before any of them is used, so that `serve` and `discover` can say in one line per missing
// privilege what is missing, for what, what was seen and how to grant it, and a prepare that needs
// it fails at once instead of with an EACCES halfway through.
//
// A feature is enabled by what the node publishes (PrivilegeNeedsOf): a PCI device to bind, an
// mdev type to create, an NVIDIA vGPU VF to set, an SR-IOV VF of a network adapter (whose MAC,
// VLAN and trust a claim may set). Each is checked the way it will be used: a sysfs attribute the
// feature writes is opened for writing through the SysfsWriter and closed unwritten (access(2) does
// not see AppArmor); capabilities are read from CapEff in the process's status file.
//
// Invariants: the check changes nothing on the node; an attribute that does not exist is not a
// missing privilege (the feature reports a missing device or driver itself); the result is in the
// fixed order of PrivilegedFeature, one entry per (privilege, feature).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "discovery/device_selection.h"
#include "discovery/inventory.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/sysfs_writer.h"

namespace vfio_dra::vfio {

enum class PrivilegedFeature {
  kPciPassthrough,  // driver_override, a driver's unbind, the VFIO driver's bind
  kMdev,            // an mdev type's create (and an instance's remove)
  kVgpuVf,          // nvidia/current_vgpu_type of a vGPU VF
  kDeviceNodes,     // stat of the /dev/vfio nodes handed to VMs, under --dev-root
  kVfNetwork,       // rtnetlink VF settings through the PF (MAC, VLAN, trust)
  kHolderNaming,    // /proc/<pid>/fd of other users' processes, to name who holds a busy device
};

// "pci-passthrough", "mdev", "vgpu-vf", "device-nodes", "vf-network", "device-holders".
const char* PrivilegedFeatureName(PrivilegedFeature feature);

struct MissingPrivilege {
  std::string privilege;  // "CAP_NET_ADMIN", "write access to /sys/bus/pci/devices/.../bind"
  PrivilegedFeature feature = PrivilegedFeature::kPciPassthrough;
  std::string error;  // what the check saw
  std::string grant;  // what to do
  // "privilege missing: <privilege> for <feature in words>: <error>; <grant>" (one line).
  std::string Line() const;
  bool operator==(const MissingPrivilege&) const = default;
};

// The enabled features, each with the sysfs attributes (relative to the sysfs root) it will write
// that are probed for it (none for the features checked by capability or device node).
struct PrivilegeNeeds {
  std::map<PrivilegedFeature, std::vector<std::string>> features;
  bool operator==(const PrivilegeNeeds&) const = default;
};

// What the published devices enable: PCI passthrough with the first published PCI device's
// driver_override, its driver's unbind and its VFIO driver's bind (when loaded); mdevs with the
// first published type's create; vGPU VFs with the first VF's current_vgpu_type; device nodes and
// holder naming with any of them; VF network settings with a published VF of a network adapter.
PrivilegeNeeds PrivilegeNeedsOf(const discovery::Inventory& inventory,
                                const discovery::DeviceSelection& selection);

struct PrivilegeCheckOptions {
  std::string dev_root = "/dev";
  // --host-netns: VF settings are made after setns(2) into it; empty: in the process's own.
  std::string host_netns;
  // False when VF settings go to the simulated kernel's files (tests), which need no capability.
  bool vf_network_in_kernel = true;
  std::string process_status = "/proc/self/status";  // CapEff is read from here
};

// Checks every enabled feature; `writer` only opens and closes (ProbeWritable).
std::vector<MissingPrivilege> CheckPrivileges(const PrivilegeNeeds& needs,
                                              const sysfs::SysfsReader& sysfs,
                                              sysfs::SysfsWriter& writer,
                                              const PrivilegeCheckOptions& options);

// The first entry for `feature`, or null.
const MissingPrivilege* FindMissing(const std::vector<MissingPrivilege>& missing,
                                    PrivilegedFeature feature);

// The effective capability set (CapEff) from a /proc/<pid>/status file.
Result<uint64_t> ReadEffectiveCapabilities(const std::string& process_status);

// Why holders of a busy device may go unnamed (CAP_SYS_PTRACE is not effective), with the fix;
// nothing when they can be named.
std::optional<std::string> HolderNamingGap(const std::string& process_status);

}  // namespace vfio_dra::vfio
