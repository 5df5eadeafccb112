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

// The protocol (TPID) of the VLAN tag a PF puts on a VF's traffic: 802.1Q, or 802.1ad (the
// service tag of QinQ), as `ip link set ... vf N vlan V proto 802.1ad` sets it.
enum class VlanProtocol { k8021Q, k8021ad };
// "802.1Q" or "802.1ad", as iproute2 and the checkpoint spell them.
const char* VlanProtocolName(VlanProtocol protocol);
std::optional<VlanProtocol> ParseVlanProtocol(const std::string& name);

// One VLAN tag, whole: the kernel sets its three parts in one request.
struct VlanTag {
  int vlan = 0;  // 0: untagged
  int qos = 0;
  VlanProtocol protocol = VlanProtocol::k8021Q;
};

struct VfNetSettings {
  std::optional<std::string> mac;          // "02:00:00:aa:bb:cc", lower case
  std::optional<int> vlan;                 // 0: untagged
  std::optional<int> qos;                  // 802.1p priority of the VLAN tag; only with `vlan`
  std::optional<VlanProtocol> vlan_proto;  // of the VLAN tag; only with `vlan`
  std::optional<bool> spoof_check;
  std::optional<bool> trust;

  bool Empty() const { return !mac && !vlan && !qos && !vlan_proto && !spoof_check && !trust; }
  bool SetsTag() const { return vlan || qos || vlan_proto; }
  // "mac 02:00:00:aa:bb:cc, vlan 42 qos 3 proto 802.1ad, spoofchk off, trust on" (only the
  // fields set; the protocol only when it is 802.1ad).
  std::string Display() const;
  // The fields of `previous` that this one sets: what undoing it means. The tag comes back whole;
  // a VLAN recorded without a protocol (read through IFLA_VF_VLAN, or recorded before protocols
  // were) was 802.1Q.
  VfNetSettings RestoreFrom(const VfNetSettings& previous) const;
  // The fields this one sets that `current` does not have (the parts of the tag together).
  VfNetSettings Unmet(const VfNetSettings& current) const;
  // The tag a write of these settings leaves on a VF whose settings are `current`: the parts set
  // here, the others as they are, except that untagged (VLAN 0) means no priority and 802.1Q.
  VlanTag TagOver(const VfNetSettings& current) const;
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
  // Sets every field of `settings` that has a value; the VLAN tag as TagOver makes it, so a part of
  // the tag left unset keeps its value. kUnimplemented when the driver does not support a setting,
  // kPermissionDenied without CAP_NET_ADMIN.
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
// {"mac": .., "vlan": .., "qos": .., "vlanProto": .., "spoofchk": .., "trust": ..} (vlanProto
// "802.1ad", or absent for 802.1Q, the kernel's default); a VF without a file does not
// exist; <dir>/<pf_device>/netdev names the PF's netdev and <dir>/<pf_device>/unsupported lists
// the settings its driver refuses. Writes replace a file atomically, so a daemon killed mid-write
// leaves the old or the new state, as the kernel would.
std::unique_ptr<VfNetwork> MakeFileVfNetwork(std::string dir);

// Parses "aa:bb:cc:dd:ee:ff" (any case) to lower case; nullopt when it is not one.
std::optional<std::string> NormalizeMac(const std::string& text);

}  // namespace vfio_dra::vfio
