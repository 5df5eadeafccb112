// The kernel side of VfNetwork: libnl-route-3. Each call opens its own sockets (a prepare touches
// a VF a few times; shared sockets would need a lock and a reconnect path for no gain), in the
// configured network namespace: a socket stays in the namespace it was created in, so only the
// creation runs on this thread inside it, and the thread returns to its own at once.
#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netlink/errno.h>
#include <netlink/netlink.h>
#include <netlink/route/link.h>
#include <netlink/route/link/sriov.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sysfs/sysfs_parse.h"
#include "sysfs/sysfs_reader.h"
#include "vfio/vf_network.h"

namespace vfio_dra::vfio {
namespace {

struct SocketFree {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};
struct LinkPut {
  void operator()(rtnl_link* l) const { rtnl_link_put(l); }
};
struct VfPut {
  void operator()(rtnl_link_vf* v) const { rtnl_link_vf_put(v); }
};
struct AddrPut {
  void operator()(nl_addr* a) const { nl_addr_put(a); }
};
struct VlansPut {
  void operator()(nl_vf_vlans_t* v) const { rtnl_link_vf_vlan_put(v); }
};
using Socket = std::unique_ptr<nl_sock, SocketFree>;
using Link = std::unique_ptr<rtnl_link, LinkPut>;
struct CachePut {
  void operator()(nl_cache* c) const { nl_cache_free(c); }
};
using Vf = std::unique_ptr<rtnl_link_vf, VfPut>;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

ErrorKind KindOf(int nl_error) {
  switch (-nl_error) {
    case NLE_OPNOTSUPP:
      return ErrorKind::kUnimplemented;
    case NLE_PERM:
      return ErrorKind::kPermissionDenied;
    case NLE_NODEV:
    case NLE_OBJ_NOTFOUND:
      return ErrorKind::kNotFound;
    case NLE_RANGE:
    case NLE_INVAL:
      return ErrorKind::kInvalidArgument;
    default:
      return ErrorKind::kUnavailable;
  }
}

Error NetlinkError(int nl_error, const std::string& what) {
  return MakeError(KindOf(nl_error), what + ": " + nl_geterror(nl_error));
}

// A route socket and an ioctl socket (for ethtool), both in the target namespace.
struct Connection {
  Socket route;
  Fd ioctl;
};

Status CreateSockets(Connection& out) {
  out.route.reset(nl_socket_alloc());
  if (!out.route) return MakeError(ErrorKind::kUnavailable, "cannot allocate a netlink socket");
  if (int err = nl_connect(out.route.get(), NETLINK_ROUTE); err < 0) {
    return NetlinkError(err, "cannot open a NETLINK_ROUTE socket");
  }
  out.ioctl = Fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (out.ioctl.get() < 0) {
    return MakeError(ErrorKind::kUnavailable, "cannot open a socket for ethtool requests: " +
                                                  std::string(std::strerror(errno)));
  }
  return Status::Ok();
}

Result<Connection> Connect(const std::string& netns_path) {
  Connection out;
  if (netns_path.empty()) {
    if (Status s = CreateSockets(out); !s.ok()) return s.error();
    return out;
  }
  Fd own(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  Fd target(open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (own.get() < 0 || target.get() < 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot open the network namespace " +
                         (own.get() < 0 ? std::string("of this thread") : netns_path) + ": " +
                         std::strerror(errno) +
                         " (the host's is /proc/1/ns/net with hostPID: true; check --host-netns)");
  }
  if (setns(target.get(), CLONE_NEWNET) != 0) {
    return MakeError(ErrorKind::kPermissionDenied,
                     "cannot enter the network namespace " + netns_path + ": " +
                         std::strerror(errno) + " (needs CAP_SYS_ADMIN: a privileged container)");
  }
  Status created = CreateSockets(out);
  if (setns(own.get(), CLONE_NEWNET) != 0) {
    // Entering it worked with the same rights, so this is resource exhaustion; the thread stays
    // in the host's namespace, which only changes where its own sockets would be created.
    return MakeError(ErrorKind::kInternal, "cannot return to this thread's network namespace: " +
                                               std::string(std::strerror(errno)));
  }
  if (!created.ok()) return created.error();
  return out;
}

// The device of a netdev as ethtool reports it ("0000:3b:00.0" for a PCI NIC).
std::string BusInfoOf(int ioctl_fd, const char* name) {
  ethtool_drvinfo info{};
  info.cmd = ETHTOOL_GDRVINFO;
  ifreq request{};
  std::strncpy(request.ifr_name, name, IFNAMSIZ - 1);
  request.ifr_data = reinterpret_cast<char*>(&info);  // NOLINT: the ioctl's ABI
  if (ioctl(ioctl_fd, SIOCETHTOOL, &request) != 0) return {};
  return std::string(info.bus_info, strnlen(info.bus_info, sizeof(info.bus_info)));
}

// The netdev of `device`: the link whose ethtool bus_info names it. Several netdevs on one
// device (switchdev representors) all report it; the first with a VF list is the PF uplink.
Result<std::string> NetdevOf(const Connection& connection, const std::string& device) {
  nl_cache* raw = nullptr;
  if (int err = rtnl_link_alloc_cache(connection.route.get(), AF_UNSPEC, &raw); err < 0) {
    return NetlinkError(err, "cannot list network interfaces");
  }
  std::unique_ptr<nl_cache, CachePut> cache(raw);
  std::string fallback;
  for (nl_object* object = nl_cache_get_first(cache.get()); object != nullptr;
       object = nl_cache_get_next(object)) {
    auto* link = reinterpret_cast<rtnl_link*>(object);  // NOLINT: libnl's object model
    const char* name = rtnl_link_get_name(link);
    if (name == nullptr || BusInfoOf(connection.ioctl.get(), name) != device) continue;
    if (rtnl_link_has_vf_list(link)) return std::string(name);
    if (fallback.empty()) fallback = name;
  }
  if (!fallback.empty()) return fallback;
  return MakeError(ErrorKind::kNotFound,
                   "no network interface belongs to " + device +
                       " (is its network driver loaded, and is the PF up in the host's network "
                       "namespace?)");
}

Result<Link> GetLink(nl_sock* socket, const std::string& netdev) {
  rtnl_link* raw = nullptr;
  if (int err = rtnl_link_get_kernel(socket, 0, netdev.c_str(), &raw); err < 0) {
    return NetlinkError(err, "cannot read network interface " + netdev);
  }
  return Link(raw);
}

std::string FormatMac(const unsigned char* bytes) {
  std::array<char, 18> text{};
  (void)std::snprintf(text.data(), text.size(), "%02x:%02x:%02x:%02x:%02x:%02x", bytes[0], bytes[1],
                      bytes[2], bytes[3], bytes[4], bytes[5]);
  return text.data();
}

VfNetSettings SettingsOf(rtnl_link_vf* vf) {
  VfNetSettings out;
  // libnl 3.7 hands out the VF's own address without a reference (unlike the VLAN list below,
  // which it references): it must not be put here.
  nl_addr* addr = nullptr;
  if (rtnl_link_vf_get_addr(vf, &addr) == 0 && addr != nullptr && nl_addr_get_len(addr) >= 6) {
    out.mac = FormatMac(static_cast<const unsigned char*>(nl_addr_get_binary_addr(addr)));
  }
  // The kernel always sends the VLAN list; libnl drops a single VLAN 0 from the old attribute.
  out.vlan = 0;
  out.qos = 0;
  nl_vf_vlans_t* raw_vlans = nullptr;
  if (rtnl_link_vf_get_vlans(vf, &raw_vlans) == 0 && raw_vlans != nullptr) {
    std::unique_ptr<nl_vf_vlans_t, VlansPut> vlans(raw_vlans);
    if (vlans->size > 0) {
      out.vlan = static_cast<int>(vlans->vlans[0].vf_vlan);
      out.qos = static_cast<int>(vlans->vlans[0].vf_vlan_qos);
    }
  }
  uint32_t value = 0;
  if (rtnl_link_vf_get_spoofchk(vf, &value) == 0) out.spoof_check = value != 0;
  if (rtnl_link_vf_get_trust(vf, &value) == 0) out.trust = value != 0;
  return out;
}

class NetlinkVfNetwork final : public VfNetwork {
 public:
  NetlinkVfNetwork(std::string netns_path, const sysfs::SysfsReader* sysfs)
      : netns_path_(std::move(netns_path)), sysfs_(sysfs) {}

  Result<std::string> PfNetdev(const VfLink& target) override {
    auto connection = Connect(netns_path_);
    if (!connection.ok()) return connection.error();
    auto found = FindNetdev(*connection, target.pf_device);
    if (!found.ok()) return found.error();
    return found->first;
  }

  Result<VfNetSettings> Read(const VfLink& target) override {
    auto pf = OpenPf(target);
    if (!pf.ok()) return pf.error();
    rtnl_link* link = pf->link.get();
    uint32_t num_vfs = 0;
    if (!rtnl_link_has_vf_list(link) || rtnl_link_get_num_vf(link, &num_vfs) < 0) {
      return MakeError(ErrorKind::kNotFound, "network interface " + pf->netdev + " of " +
                                                 target.pf_device + " reports no SR-IOV VFs");
    }
    Vf vf(rtnl_link_vf_get(link, static_cast<uint32_t>(target.vf_index)));
    if (!vf) {
      return MakeError(ErrorKind::kNotFound, "network interface " + pf->netdev + " of " +
                                                 target.pf_device + " has no VF " +
                                                 std::to_string(target.vf_index) + " (it reports " +
                                                 std::to_string(num_vfs) + ")");
    }
    return SettingsOf(vf.get());
  }

  Status Write(const VfLink& target, const VfNetSettings& settings) override {
    auto pf = OpenPf(target);
    if (!pf.ok()) return pf.error();
    nl_sock* socket = pf->connection.route.get();
    Link* link = &pf->link;
    // One request per setting: the kernel applies the attributes of one request in turn and stops
    // at the first the driver refuses, so a combined request could not say which one failed.
    if (settings.mac) {
      auto mac = NormalizeMac(*settings.mac);
      if (!mac) return MakeError(ErrorKind::kInvalidArgument, "bad MAC " + *settings.mac);
      std::array<unsigned char, ETH_ALEN> bytes{};
      for (size_t i = 0; i < bytes.size(); ++i) {
        bytes[i] = static_cast<unsigned char>(std::stoi(mac->substr(i * 3, 2), nullptr, 16));
      }
      std::unique_ptr<nl_addr, AddrPut> addr(nl_addr_build(AF_LLC, bytes.data(), bytes.size()));
      if (!addr) return MakeError(ErrorKind::kInternal, "cannot build a netlink address");
      if (Status s = Change(socket, link->get(), target, "mac " + *mac,
                            [&](rtnl_link_vf* vf) { rtnl_link_vf_set_addr(vf, addr.get()); });
          !s.ok()) {
        return s;
      }
    }
    if (settings.vlan || settings.qos) {
      nl_vf_vlans_t* raw = nullptr;
      if (rtnl_link_vf_vlan_alloc(&raw, 1) < 0) {
        return MakeError(ErrorKind::kInternal, "cannot allocate a netlink VLAN list");
      }
      std::unique_ptr<nl_vf_vlans_t, VlansPut> vlans(raw);
      vlans->vlans[0].vf_vlan = static_cast<uint32_t>(settings.vlan.value_or(0));
      vlans->vlans[0].vf_vlan_qos = static_cast<uint32_t>(settings.qos.value_or(0));
      vlans->vlans[0].vf_vlan_proto = ETH_P_8021Q;
      const std::string what = "vlan " + std::to_string(settings.vlan.value_or(0)) + " qos " +
                               std::to_string(settings.qos.value_or(0));
      if (Status s = Change(socket, link->get(), target, what,
                            [&](rtnl_link_vf* vf) { rtnl_link_vf_set_vlans(vf, vlans.get()); });
          !s.ok()) {
        return s;
      }
    }
    const auto toggle = [&](const std::optional<bool>& value, const char* name,
                            void (*set)(rtnl_link_vf*, uint32_t)) -> Status {
      if (!value) return Status::Ok();
      const uint32_t on = *value ? 1 : 0;
      return Change(socket, link->get(), target, std::string(name) + (on ? " on" : " off"),
                    [&](rtnl_link_vf* vf) { set(vf, on); });
    };
    if (Status s = toggle(settings.spoof_check, "spoofchk", rtnl_link_vf_set_spoofchk); !s.ok()) {
      return s;
    }
    if (Status s = toggle(settings.trust, "trust", rtnl_link_vf_set_trust); !s.ok()) return s;
    return Status::Ok();
  }

 private:
  // The PF's netdev and its link with the VF list, over a connection in our namespace.
  struct OpenedPf {
    Connection connection;
    std::string netdev;
    Link link;
  };
  Result<OpenedPf> OpenPf(const VfLink& target) const {
    auto connection = Connect(netns_path_);
    if (!connection.ok()) return connection.error();
    auto found = FindNetdev(*connection, target.pf_device);
    if (!found.ok()) return found.error();
    return OpenedPf{std::move(*connection), std::move(found->first), std::move(found->second)};
  }

  // The PF's netdev and its link. sysfs lists a device's netdevs in its net/ directory: that of
  // the PCI function for most drivers, that of a child device for some (virtio-net's virtioN).
  // A PCI PF with neither directory has no netdev at all (no netlink needed); a listed name that
  // ethtool confirms in the target namespace spares listing every link of the node (one veth per
  // pod). Anything else (a name renamed since, a sysfs of another namespace, a device that is not
  // PCI) falls back to the full listing.
  Result<std::pair<std::string, Link>> FindNetdev(const Connection& connection,
                                                  const std::string& device) const {
    if (sysfs_ != nullptr && sysfs::CanonicalBdf(device).ok()) {
      bool any_net_directory = false;
      auto names = SysfsNetdevs(device, any_net_directory);
      if (names && !any_net_directory) {
        return MakeError(ErrorKind::kNotFound, "PCI device " + device +
                                                   " has no network interface (is its network "
                                                   "driver loaded?)");
      }
      std::optional<std::pair<std::string, Link>> fallback;
      for (const std::string& name : names.value_or(std::vector<std::string>{})) {
        if (BusInfoOf(connection.ioctl.get(), name.c_str()) != device) continue;
        auto link = GetLink(connection.route.get(), name);
        if (!link.ok()) continue;
        // Switchdev representors sit on the PF too: the uplink is the one with the VF list.
        if (rtnl_link_has_vf_list(link->get())) return std::pair(name, std::move(*link));
        if (!fallback) fallback.emplace(name, std::move(*link));
      }
      if (fallback) return std::move(*fallback);
    }
    auto netdev = NetdevOf(connection, device);
    if (!netdev.ok()) return netdev.error();
    auto link = GetLink(connection.route.get(), *netdev);
    if (!link.ok()) return link.error();
    return std::pair(std::move(*netdev), std::move(*link));
  }

  // The netdev names sysfs shows under the PCI function and its child devices; nullopt when the
  // function itself cannot be read (then nothing can be concluded). `any_net_directory` says
  // whether a net/ directory exists at all: one that lists nothing is what a sysfs mounted in
  // another network namespace shows, so only its absence means "no netdev".
  std::optional<std::vector<std::string>> SysfsNetdevs(const std::string& device,
                                                       bool& any_net_directory) const {
    const std::string dir = "bus/pci/devices/" + device;
    // Most drivers list the function's netdevs in its own net/: then no child needs a look (a PF
    // has some sixty attribute files and a link per VF, each a failed open on every prepare).
    if (auto own = sysfs_->List(dir + "/net"); own.ok() && !own->empty()) {
      any_net_directory = true;
      return *own;
    }
    auto entries = sysfs_->List(dir);
    if (!entries.ok()) return std::nullopt;
    std::vector<std::string> names;
    for (const std::string& entry : *entries) {
      // Links to other devices are not children (a VF's netdevs are not the PF's); attribute
      // files fail at once, not being directories.
      if (entry == "subsystem" || entry == "driver" || entry == "physfn" ||
          entry == "iommu_group" || entry == "firmware_node" || entry.rfind("virtfn", 0) == 0) {
        continue;
      }
      const std::string net = entry == "net" ? dir + "/net" : dir + "/" + entry + "/net";
      auto listed = sysfs_->List(net);
      if (listed.ok()) names.insert(names.end(), listed->begin(), listed->end());
      if (listed.ok() || listed.error().kind != ErrorKind::kNotFound) any_net_directory = true;
    }
    return names;
  }

  std::string netns_path_;
  const sysfs::SysfsReader* sysfs_;  // may be null: every lookup lists the links

  template <typename SetField>
  static Status Change(nl_sock* socket, rtnl_link* orig, const VfLink& target,
                       const std::string& what, SetField set_field) {
    Link change(rtnl_link_alloc());
    Vf vf(rtnl_link_vf_alloc());
    if (!change || !vf) return MakeError(ErrorKind::kInternal, "out of memory building netlink");
    rtnl_link_set_ifindex(change.get(), rtnl_link_get_ifindex(orig));
    rtnl_link_vf_set_index(vf.get(), static_cast<uint32_t>(target.vf_index));
    set_field(vf.get());
    if (int err = rtnl_link_vf_add(change.get(), vf.get()); err < 0) {
      return NetlinkError(err, "cannot build the change of " + target.Display());
    }
    if (int err = rtnl_link_change(socket, orig, change.get(), 0); err < 0) {
      Error error = NetlinkError(err, "cannot set " + what + " on " + target.Display());
      if (error.kind == ErrorKind::kUnimplemented) {
        error.message += " (the PF's driver does not support this VF setting)";
      }
      return error;
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<VfNetwork> MakeNetlinkVfNetwork(std::string netns_path,
                                                const sysfs::SysfsReader* sysfs) {
  return std::make_unique<NetlinkVfNetwork>(std::move(netns_path), sysfs);
}

}  // namespace vfio_dra::vfio
