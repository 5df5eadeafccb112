// VfNetwork: the per-VF settings an SR-IOV PF's driver keeps for each of its VFs (the MAC the VF
// gets, a VLAN the PF tags its traffic with, spoof checking, trust), read and written through the
// PF's netdev as `ip link set <pf> vf <n> ...` does. A VF handed to a VM keeps these settings
// while vfio-pci holds it, so they are set before binding and restored after unbinding.
//
// The kernel implementation speaks rtnetlink through libmnl; the file-backed one stands in
// for it where the node is a simulated sysfs tree (tests), so that the daemon's whole prepare and
// crash-recovery path runs there too.
//
// Invariants: a Read reports only what the driver reports (a field the driver leaves out stays
// unset, and is then never "restored"); a Write sets each field that has a value with its own
// request, so an error names the one setting the driver refused and the ones before it stay set.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "base/result.h"

namespace vfio_dra::sysfs {
class SysfsReader;
}

namespace vfio_dra::vfio {

struct VfNetSettings {
  std::optional<std::string> mac;  // "02:00:00:aa:bb:cc", lower case
  std::optional<int> vlan;         // 0: untagged
  std::optional<int> qos;          // 802.1p priority of the VLAN tag; only with `vlan`
  std::optional<bool> spoof_check;
  std::optional<bool> trust;

  bool Empty() const { return !mac && !vlan && !qos && !spoof_check && !trust; }
  // "mac 02:00:00:aa:bb:cc, vlan 42 qos 3, spoofchk off, trust on" (only the fields set).
  std::string Display() const;
  // The fields of `previous` that this one sets: what undoing it means.
  VfNetSettings RestoreFrom(const VfNetSettings& previous) const;
  // The fields this one sets that `current` does not have (vlan and qos together).
  VfNetSettings Unmet(const VfNetSettings& current) const;
  // True when every field this one sets has the same value in `current`.
  bool SatisfiedBy(const VfNetSettings& current) const { return Unmet(current).Empty(); }
  bool operator==(const VfNetSettings&) const = default;
};

// A VF as its PF knows it. The PF is named by its device (a PCI address), not by its netdev:
// the plugin's container does not see the host's netdevs in its own /sys, and names can change.
struct VfLink {
  std::string pf_device;  // the PF's bus device, e.g. "0000:3b:00.0"
  int vf_index = 0;       // N of the PF's virtfnN link
  std::string Display() const { return "VF " + std::to_string(vf_index) + " of " + pf_device; }
  bool operator==(const VfLink&) const = default;
};

class VfNetwork {
 public:
  virtual ~VfNetwork() = default;
  // What the PF's driver reports for the VF. kNotFound when the PF has no netdev or no such VF;
  // kUnavailable when the netlink socket cannot be opened.
  virtual Result<VfNetSettings> Read(const VfLink& link) = 0;
  // The PF's netdev name now (for messages and reports).
  virtual Result<std::string> PfNetdev(const VfLink& link) = 0;
  // Sets every field of `settings` that has a value (vlan and qos together). kUnimplemented when
  // the driver does not support a setting, kPermissionDenied without CAP_NET_ADMIN.
  virtual Status Write(const VfLink& link, const VfNetSettings& settings) = 0;
};

// rtnetlink (RTM_GETLINK with RTEXT_FILTER_VF; RTM_SETLINK with IFLA_VFINFO_LIST) in the network
// namespace at `netns_path` (e.g. /proc/1/ns/net with hostPID: the host's, where PFs' netdevs
// live), or the process's own when empty. The PF's netdev is the link whose device (ethtool's
// bus_info, what `ethtool -i` prints) is `pf_device`. With `sysfs` (which must outlive it), a PCI
// PF's netdevs are first looked up in its sysfs net/ directory, and a PF without one is known to
// have none without asking the kernel; null: every lookup lists the links.
std::unique_ptr<VfNetwork> MakeNetlinkVfNetwork(std::string netns_path,
                                                const sysfs::SysfsReader* sysfs = nullptr);

// The simulated kernel's VF settings: <dir>/<pf_device>/vf<N>.json holds
// {"mac": .., "vlan": .., "qos": .., "spoofchk": .., "trust": ..}; a VF without a file does not
// exist; <dir>/<pf_device>/netdev names the PF's netdev and <dir>/<pf_device>/unsupported lists
// the settings its driver refuses. Writes replace a file atomically, so a daemon killed mid-write
// leaves the old or the new state, as the kernel would.
std::unique_ptr<VfNetwork> MakeFileVfNetwork(std::string dir);

// Parses "aa:bb:cc:dd:ee:ff" (any case) to lower case; nullopt when it is not one.
std::optional<std::string> NormalizeMac(const std::string& text);

}  // namespace vfio_dra::vfio
