// The kernel side of VfNetwork: rtnetlink over libmnl. Each call opens its own sockets (a prepare
// touches a VF a few times; shared sockets would need a lock and a reconnect path for no gain), in
// the configured network namespace: a socket stays in the namespace it was created in, so only the
// creation runs on this thread inside it, and the thread returns to its own at once.
//
// Requests are built and answers parsed here, attribute by attribute, against the kernel's UAPI
// structs (linux/if_link.h): an attribute shorter than its struct is skipped, never read past.
#include <arpa/inet.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"
#include "sysfs/sysfs_reader.h"
#include "vfio/vf_network.h"

namespace vfio_dra::vfio {
namespace {

// Room for one request: a link name or one VF setting, with their headers.
constexpr size_t kRequestBytes = 512;
using RequestBuffer = std::array<char, kRequestBytes>;

struct SocketClose {
  void operator()(mnl_socket* s) const { mnl_socket_close(s); }
};
using Socket = std::unique_ptr<mnl_socket, SocketClose>;

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

ErrorKind KindOf(int err) {
  switch (err) {
    case EOPNOTSUPP:
      return ErrorKind::kUnimplemented;
    case EPERM:
    case EACCES:
      return ErrorKind::kPermissionDenied;
    case ENODEV:
    case ENOENT:
      return ErrorKind::kNotFound;
    case ERANGE:
    case EINVAL:
      return ErrorKind::kInvalidArgument;
    default:
      return ErrorKind::kUnavailable;
  }
}

// `detail` is the kernel's extended acknowledgement, when it gave one (why a driver refused).
Error NetlinkError(int err, const std::string& what, const std::string& detail = "") {
  return MakeError(KindOf(err),
                   what + ": " + ErrnoText(err) + (detail.empty() ? "" : ": " + detail));
}

// A route socket and an ioctl socket (for ethtool), both in the target namespace.
struct Connection {
  Socket route;
  Fd ioctl;
  // Each request its own sequence number: an answer to an earlier request is never taken for
  // the next one's.
  uint32_t last_seq = 0;
};

Status CreateSockets(Connection& out) {
  out.route.reset(mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC));
  if (!out.route || mnl_socket_bind(out.route.get(), 0, MNL_SOCKET_AUTOPID) < 0) {
    return NetlinkError(errno, "cannot open a NETLINK_ROUTE socket");
  }
  // The kernel then says why a driver refused a setting, where it knows (best effort: kernels
  // before 4.12 answer with the errno alone).
  int on = 1;
  (void)mnl_socket_setsockopt(out.route.get(), NETLINK_EXT_ACK, &on, sizeof on);
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
                         " (the host's is /proc/1/ns/net with hostPID: true, and opening it needs "
                         "CAP_SYS_PTRACE; or drop --host-netns and run with hostNetwork: true)");
  }
  if (setns(target.get(), CLONE_NEWNET) != 0) {
    return MakeError(ErrorKind::kPermissionDenied,
                     "cannot enter the network namespace " + netns_path + ": " +
                         std::strerror(errno) +
                         " (needs CAP_SYS_ADMIN; or drop --host-netns and run with hostNetwork: "
                         "true and CAP_NET_ADMIN: the Helm value sriovNetwork.enabled=true)");
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

// One link as RTM_GETLINK reports it, with its VFs' settings (RTEXT_FILTER_VF).
struct LinkInfo {
  int index = 0;
  std::string name;
  // The kernel lists the VFs when the device has some and its driver reports their settings.
  bool has_vf_list = false;
  std::optional<uint32_t> num_vfs;
  std::vector<std::pair<uint32_t, VfNetSettings>> vfs;  // by VF index, in the kernel's order

  const VfNetSettings* Vf(uint32_t vf) const {
    for (const auto& [number, settings] : vfs) {
      if (number == vf) return &settings;
    }
    return nullptr;
  }
};

// The payload of `attr` as a UAPI struct, or null when the attribute is too short for it.
template <typename T>
const T* PayloadAs(const nlattr* attr) {
  if (mnl_attr_get_payload_len(attr) < sizeof(T)) return nullptr;
  return static_cast<const T*>(mnl_attr_get_payload(attr));
}

// Calls `each` with every attribute of a nest, or of a message from `offset` into its payload
// (libmnl's for-each macros only compile as C).
using AttributeVisitor = std::function<void(const nlattr*)>;
int Visit(const nlattr* attr, void* data) {
  (*static_cast<const AttributeVisitor*>(data))(attr);
  return MNL_CB_OK;
}
void ForEachNested(const nlattr* nest, const AttributeVisitor& each) {
  (void)mnl_attr_parse_nested(nest, Visit, const_cast<AttributeVisitor*>(&each));  // NOLINT
}
void ForEachAttribute(const nlmsghdr* message, size_t offset, const AttributeVisitor& each) {
  (void)mnl_attr_parse(message, static_cast<unsigned int>(offset), Visit,
                       const_cast<AttributeVisitor*>(&each));  // NOLINT
}

std::string FormatMac(const unsigned char* bytes) {
  std::array<char, 18> text{};
  (void)std::snprintf(text.data(), text.size(), "%02x:%02x:%02x:%02x:%02x:%02x", bytes[0], bytes[1],
                      bytes[2], bytes[3], bytes[4], bytes[5]);
  return text.data();
}

// One IFLA_VF_INFO. The kernel sends every field; one the driver does not report comes as -1
// (spoofchk, trust) and is left unset.
std::optional<std::pair<uint32_t, VfNetSettings>> ParseVfInfo(const nlattr* info) {
  std::optional<uint32_t> index;
  VfNetSettings out;
  out.vlan = 0;
  out.qos = 0;
  out.vlan_proto = VlanProtocol::k8021Q;
  bool vlan_from_list = false;
  const auto set_vlan = [&](uint32_t vf, uint32_t vlan, uint32_t qos, VlanProtocol protocol) {
    index = vf;
    out.vlan = static_cast<int>(vlan);
    out.qos = static_cast<int>(qos);
    out.vlan_proto = protocol;
  };
  const auto toggle = [&](uint32_t vf, uint32_t setting, std::optional<bool>& field) {
    index = vf;
    if (setting != static_cast<uint32_t>(-1)) field = setting != 0;
  };
  ForEachNested(info, [&](const nlattr* attr) {
    switch (mnl_attr_get_type(attr)) {
      case IFLA_VF_MAC:
        if (const auto* mac = PayloadAs<ifla_vf_mac>(attr)) {
          index = mac->vf;
          out.mac = FormatMac(mac->mac);
        }
        break;
      case IFLA_VF_VLAN:
        // IFLA_VF_VLAN carries no protocol: it is the 802.1Q view of the tag.
        if (const auto* vlan = PayloadAs<ifla_vf_vlan>(attr); vlan && !vlan_from_list) {
          set_vlan(vlan->vf, vlan->vlan, vlan->qos, VlanProtocol::k8021Q);
        }
        break;
      case IFLA_VF_VLAN_LIST:
        // Newer than IFLA_VF_VLAN and authoritative when present: its first entry is the tag.
        ForEachNested(attr, [&](const nlattr* entry) {
          const auto* vlan = mnl_attr_get_type(entry) == IFLA_VF_VLAN_INFO
                                 ? PayloadAs<ifla_vf_vlan_info>(entry)
                                 : nullptr;
          if (vlan == nullptr || vlan_from_list) return;
          // Any other value is 802.1Q: the kernel's default, which a driver that keeps no
          // protocol of its own (netdevsim, until one is set) reports as 0.
          set_vlan(vlan->vf, vlan->vlan, vlan->qos,
                   ntohs(vlan->vlan_proto) == ETH_P_8021AD ? VlanProtocol::k8021ad
                                                           : VlanProtocol::k8021Q);
          vlan_from_list = true;
        });
        break;
      case IFLA_VF_SPOOFCHK:
        if (const auto* spoofchk = PayloadAs<ifla_vf_spoofchk>(attr)) {
          toggle(spoofchk->vf, spoofchk->setting, out.spoof_check);
        }
        break;
      case IFLA_VF_TRUST:
        if (const auto* trust = PayloadAs<ifla_vf_trust>(attr)) {
          toggle(trust->vf, trust->setting, out.trust);
        }
        break;
      default:
        break;
    }
  });
  if (!index) return std::nullopt;
  return std::pair(*index, std::move(out));
}

// A link message; one too short to be one comes back without a name (and is skipped).
LinkInfo ParseLink(const nlmsghdr* message) {
  LinkInfo link;
  if (mnl_nlmsg_get_payload_len(message) < sizeof(ifinfomsg)) return link;
  const auto* header = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(message));
  link.index = header->ifi_index;
  ForEachAttribute(message, sizeof(ifinfomsg), [&](const nlattr* attr) {
    switch (mnl_attr_get_type(attr)) {
      case IFLA_IFNAME:
        if (mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) == 0) link.name = mnl_attr_get_str(attr);
        break;
      case IFLA_NUM_VF:
        if (mnl_attr_validate(attr, MNL_TYPE_U32) == 0) link.num_vfs = mnl_attr_get_u32(attr);
        break;
      case IFLA_VFINFO_LIST:
        link.has_vf_list = true;
        ForEachNested(attr, [&](const nlattr* info) {
          if (mnl_attr_get_type(info) != IFLA_VF_INFO) return;
          if (auto vf = ParseVfInfo(info)) link.vfs.push_back(std::move(*vf));
        });
        break;
      default:
        break;
    }
  });
  return link;
}

// What one request got back: the kernel's errno (0: none) and its extended acknowledgement.
struct Answer {
  int error = 0;
  std::string detail;
};

int OnError(const nlmsghdr* message, void* data) {
  auto* answer = static_cast<Answer*>(data);
  if (message->nlmsg_len < mnl_nlmsg_size(sizeof(nlmsgerr))) {
    answer->error = EBADMSG;
    return MNL_CB_ERROR;
  }
  const auto* error = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(message));
  if (error->error == 0) return MNL_CB_STOP;  // the acknowledgement of a request that worked
  answer->error = -error->error;
  if ((message->nlmsg_flags & NLM_F_ACK_TLVS) != 0) {
    // After the error comes the request it answers (unless capped), then the attributes.
    const size_t offset =
        sizeof(nlmsgerr) + ((message->nlmsg_flags & NLM_F_CAPPED) != 0
                                ? 0
                                : MNL_ALIGN(error->msg.nlmsg_len) - sizeof(nlmsghdr));
    if (offset <= mnl_nlmsg_get_payload_len(message)) {
      ForEachAttribute(message, offset, [&](const nlattr* attr) {
        if (mnl_attr_get_type(attr) == NLMSGERR_ATTR_MSG &&
            mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) == 0) {
          answer->detail = mnl_attr_get_str(attr);
        }
      });
    }
  }
  return MNL_CB_ERROR;
}

// Whether the `length` bytes at `buffer` hold the end of an answer (NLMSG_DONE or NLMSG_ERROR).
bool EndsAnswer(const char* buffer, size_t length) {
  auto left = static_cast<int>(length);
  for (const auto* message = reinterpret_cast<const nlmsghdr*>(buffer);  // NOLINT: netlink ABI
       mnl_nlmsg_ok(message, left); message = mnl_nlmsg_next(message, &left)) {
    if (message->nlmsg_type == NLMSG_DONE || message->nlmsg_type == NLMSG_ERROR) return true;
  }
  return false;
}

// Sends `request` (NLM_F_ACK is added unless it is a dump) and hands each message of the answer
// to `each`, until the acknowledgement, the end of the dump or the kernel's error. A dump the
// kernel marks interrupted (NLM_F_DUMP_INTR: links came or went meanwhile) is read to its end,
// so the socket can be used again, and fails with EINTR with `*interrupted` set.
Status Transact(Connection& connection, nlmsghdr* request, const std::string& what,
                const std::function<void(const nlmsghdr*)>& each, bool* interrupted = nullptr) {
  mnl_socket* socket = connection.route.get();
  const bool dump = (request->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  if (!dump) request->nlmsg_flags |= NLM_F_ACK;
  const uint32_t seq = ++connection.last_seq;
  request->nlmsg_seq = seq;
  if (mnl_socket_sendto(socket, request, request->nlmsg_len) < 0) {
    return NetlinkError(errno, what);
  }
  struct Context {
    const std::function<void(const nlmsghdr*)>* each;
    Answer answer;
  } context{&each, {}};
  const auto on_data = [](const nlmsghdr* message, void* data) -> int {
    auto* c = static_cast<Context*>(data);
    (*c->each)(message);
    return MNL_CB_OK;
  };
  // Every control message type has its handler: libmnl ignores one left null in the array.
  std::array<mnl_cb_t, NLMSG_MIN_TYPE> control{};
  control[NLMSG_NOOP] = [](const nlmsghdr*, void*) -> int { return MNL_CB_OK; };
  control[NLMSG_ERROR] = [](const nlmsghdr* message, void* data) -> int {
    return OnError(message, &static_cast<Context*>(data)->answer);
  };
  control[NLMSG_DONE] = [](const nlmsghdr* message, void* data) -> int {
    // A dump that failed part way says so here.
    if (mnl_nlmsg_get_payload_len(message) >= sizeof(int)) {
      int error = 0;
      std::memcpy(&error, mnl_nlmsg_get_payload(message), sizeof error);
      if (error < 0) {
        static_cast<Context*>(data)->answer.error = -error;
        return MNL_CB_ERROR;
      }
    }
    return MNL_CB_STOP;
  };
  control[NLMSG_OVERRUN] = [](const nlmsghdr*, void* data) -> int {
    static_cast<Context*>(data)->answer.error = ENOBUFS;
    return MNL_CB_ERROR;
  };
  const unsigned int port = mnl_socket_get_portid(socket);
  std::vector<char> buffer(MNL_SOCKET_BUFFER_SIZE);
  // One link with many VFs is a single message larger than any fixed buffer: the next
  // datagram's size is asked first.
  const auto receive = [&]() -> ssize_t {
    for (;;) {
      const ssize_t size = recv(mnl_socket_get_fd(socket), nullptr, 0, MSG_PEEK | MSG_TRUNC);
      if (size < 0 && errno == EINTR) continue;
      if (size < 0) return size;
      if (static_cast<size_t>(size) > buffer.size()) buffer.resize(static_cast<size_t>(size));
      const ssize_t got = mnl_socket_recvfrom(socket, buffer.data(), buffer.size());
      if (got < 0 && errno == EINTR) continue;
      return got;
    }
  };
  for (;;) {
    const ssize_t got = receive();
    if (got < 0) return NetlinkError(errno, what);
    const int run = mnl_cb_run2(buffer.data(), static_cast<size_t>(got), seq, port, on_data,
                                &context, control.data(), control.size());
    if (run == MNL_CB_STOP) return Status::Ok();
    if (run == MNL_CB_ERROR && dump && context.answer.error == 0 && errno == EINTR) {
      bool ended = EndsAnswer(buffer.data(), static_cast<size_t>(got));
      while (!ended) {
        const ssize_t more = receive();
        if (more < 0) return NetlinkError(errno, what);
        ended = EndsAnswer(buffer.data(), static_cast<size_t>(more));
      }
      if (interrupted != nullptr) *interrupted = true;
      return NetlinkError(EINTR, what, "the links changed while they were listed");
    }
    if (run == MNL_CB_ERROR) {
      return NetlinkError(context.answer.error != 0 ? context.answer.error : errno, what,
                          context.answer.detail);
    }
  }
}

// A request for link messages with their VFs' settings (no statistics).
nlmsghdr* PutGetLink(char* buffer, uint16_t flags) {
  nlmsghdr* request = mnl_nlmsg_put_header(buffer);
  request->nlmsg_type = RTM_GETLINK;
  request->nlmsg_flags = NLM_F_REQUEST | flags;
  auto* header = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(request, sizeof(ifinfomsg)));
  header->ifi_family = AF_UNSPEC;
  mnl_attr_put_u32(request, IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS);
  return request;
}

// The netdev of `device`: the link whose ethtool bus_info names it. Several netdevs on one
// device (switchdev representors) all report it; the first with a VF list is the PF uplink.
Result<LinkInfo> NetdevOf(Connection& connection, const std::string& device) {
  // Links come and go on a node (a veth per pod): an interrupted listing is listed again.
  constexpr int kAttempts = 3;
  std::optional<LinkInfo> uplink;
  std::optional<LinkInfo> fallback;
  for (int attempt = 1;; ++attempt) {
    alignas(nlmsghdr) RequestBuffer buffer{};
    nlmsghdr* request = PutGetLink(buffer.data(), NLM_F_DUMP);
    uplink.reset();
    fallback.reset();
    bool interrupted = false;
    Status listed = Transact(
        connection, request, "cannot list network interfaces",
        [&](const nlmsghdr* message) {
          if (uplink || message->nlmsg_type != RTM_NEWLINK) return;
          LinkInfo link = ParseLink(message);
          if (link.name.empty() || BusInfoOf(connection.ioctl.get(), link.name.c_str()) != device) {
            return;
          }
          if (link.has_vf_list) {
            uplink = std::move(link);
          } else if (!fallback) {
            fallback = std::move(link);
          }
        },
        &interrupted);
    if (listed.ok()) break;
    if (!interrupted || attempt == kAttempts) return listed.error();
  }
  if (uplink) return std::move(*uplink);
  if (fallback) return std::move(*fallback);
  return MakeError(ErrorKind::kNotFound,
                   "no network interface belongs to " + device +
                       " (is its network driver loaded, and is the PF up in the host's network "
                       "namespace?)");
}

Result<LinkInfo> GetLink(Connection& connection, const std::string& netdev) {
  alignas(nlmsghdr) RequestBuffer buffer{};
  nlmsghdr* request = PutGetLink(buffer.data(), 0);
  mnl_attr_put_strz(request, IFLA_IFNAME, netdev.c_str());
  std::optional<LinkInfo> link;
  Status got = Transact(connection, request, "cannot read network interface " + netdev,
                        [&](const nlmsghdr* message) {
                          if (message->nlmsg_type == RTM_NEWLINK) link = ParseLink(message);
                        });
  if (!got.ok()) return got.error();
  if (!link) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot read network interface " + netdev + ": the kernel sent no link");
  }
  return std::move(*link);
}

class NetlinkVfNetwork final : public VfNetwork {
 public:
  NetlinkVfNetwork(std::string netns_path, const sysfs::SysfsReader* sysfs)
      : netns_path_(std::move(netns_path)), sysfs_(sysfs) {}

  Result<std::string> PfNetdev(const VfLink& target) override {
    auto pf = OpenPf(target);
    if (!pf.ok()) return pf.error();
    return std::move(pf->netdev);
  }

  Result<VfNetSettings> Read(const VfLink& target) override {
    auto pf = OpenPf(target);
    if (!pf.ok()) return pf.error();
    const LinkInfo& link = pf->link;
    if (!link.has_vf_list) {
      return MakeError(ErrorKind::kNotFound, "network interface " + pf->netdev + " of " +
                                                 target.pf_device + " reports no SR-IOV VFs");
    }
    const VfNetSettings* vf = link.Vf(static_cast<uint32_t>(target.vf_index));
    if (vf == nullptr) {
      return MakeError(ErrorKind::kNotFound,
                       "network interface " + pf->netdev + " of " + target.pf_device +
                           " has no VF " + std::to_string(target.vf_index) + " (it reports " +
                           std::to_string(link.num_vfs.value_or(link.vfs.size())) + ")");
    }
    return *vf;
  }

  Status Write(const VfLink& target, const VfNetSettings& settings) override {
    auto pf = OpenPf(target);
    if (!pf.ok()) return pf.error();
    Connection& connection = pf->connection;
    const int ifindex = pf->link.index;
    const auto vf = static_cast<uint32_t>(target.vf_index);
    // One request per setting: the kernel applies the attributes of one request in turn and stops
    // at the first the driver refuses, so a combined request could not say which one failed.
    if (settings.mac) {
      auto mac = NormalizeMac(*settings.mac);
      if (!mac) return MakeError(ErrorKind::kInvalidArgument, "bad MAC " + *settings.mac);
      ifla_vf_mac value{};
      value.vf = vf;
      for (size_t i = 0; i < ETH_ALEN; ++i) {
        value.mac[i] = static_cast<unsigned char>(std::stoi(mac->substr(i * 3, 2), nullptr, 16));
      }
      if (Status s = Change(connection, ifindex, target, "mac " + *mac, IFLA_VF_MAC, value);
          !s.ok()) {
        return s;
      }
    }
    if (settings.SetsTag()) {
      // The whole tag in one request, so the parts not asked for are written back as they are.
      const VfNetSettings* current = pf->link.Vf(vf);
      const VlanTag tag = settings.TagOver(current ? *current : VfNetSettings{});
      if (Status s = SetVlan(connection, ifindex, target, tag); !s.ok()) return s;
    }
    if (settings.spoof_check) {
      const ifla_vf_spoofchk value{vf, *settings.spoof_check ? 1U : 0U};
      if (Status s = Change(connection, ifindex, target,
                            std::string("spoofchk ") + (*settings.spoof_check ? "on" : "off"),
                            IFLA_VF_SPOOFCHK, value);
          !s.ok()) {
        return s;
      }
    }
    if (settings.trust) {
      const ifla_vf_trust value{vf, *settings.trust ? 1U : 0U};
      if (Status s = Change(connection, ifindex, target,
                            std::string("trust ") + (*settings.trust ? "on" : "off"), IFLA_VF_TRUST,
                            value);
          !s.ok()) {
        return s;
      }
    }
    return Status::Ok();
  }

 private:
  // The PF's netdev and its link with the VF list, over a connection in our namespace.
  struct OpenedPf {
    Connection connection;
    std::string netdev;
    LinkInfo link;
  };
  Result<OpenedPf> OpenPf(const VfLink& target) const {
    // sysfs first: a PF it shows without a netdev needs no sockets at all.
    auto names = SysfsCandidates(target.pf_device);
    if (!names.ok()) return names.error();
    auto connection = Connect(netns_path_);
    if (!connection.ok()) return connection.error();
    auto found = FindNetdev(*connection, target.pf_device, *names);
    if (!found.ok()) return found.error();
    return OpenedPf{std::move(*connection), std::move(found->first), std::move(found->second)};
  }

  // The netdev names sysfs shows for a PCI device (see SysfsNetdevs); nullopt when sysfs cannot
  // say (no sysfs given, a device that is not PCI, a function that cannot be read); kNotFound when
  // it shows that the device has no netdev.
  Result<std::optional<std::vector<std::string>>> SysfsCandidates(const std::string& device) const {
    if (sysfs_ == nullptr || !sysfs::CanonicalBdf(device).ok()) {
      return std::optional<std::vector<std::string>>();
    }
    bool any_net_directory = false;
    auto names = SysfsNetdevs(device, any_net_directory);
    if (names && !any_net_directory) {
      return MakeError(ErrorKind::kNotFound, "PCI device " + device +
                                                 " has no network interface (is its network "
                                                 "driver loaded?)");
    }
    return names;
  }

  // The PF's netdev and its link. sysfs lists a device's netdevs in its net/ directory: that of
  // the PCI function for most drivers, that of a child device for some (virtio-net's virtioN).
  // A listed name that ethtool confirms in the target namespace spares listing every link of the
  // node (one veth per pod). Anything else (no names from sysfs, a name renamed since, a sysfs of
  // another namespace) falls back to the full listing.
  Result<std::pair<std::string, LinkInfo>> FindNetdev(
      Connection& connection, const std::string& device,
      const std::optional<std::vector<std::string>>& names) const {
    std::optional<std::pair<std::string, LinkInfo>> fallback;
    for (const std::string& name : names.value_or(std::vector<std::string>{})) {
      if (BusInfoOf(connection.ioctl.get(), name.c_str()) != device) continue;
      auto link = GetLink(connection, name);
      if (!link.ok()) continue;
      // Switchdev representors sit on the PF too: the uplink is the one with the VF list.
      if (link->has_vf_list) return std::pair(name, std::move(*link));
      if (!fallback) fallback.emplace(name, std::move(*link));
    }
    if (fallback) return std::move(*fallback);
    auto link = NetdevOf(connection, device);
    if (!link.ok()) return link.error();
    std::string name = link->name;
    return std::pair(std::move(name), std::move(*link));
  }

  // The netdev names sysfs shows under the PCI function and its child devices; nullopt when the
  // function itself cannot be read (then nothing can be concluded). `any_net_directory` says
  // whether a net/ directory exists at all: one that lists nothing is what a sysfs mounted in
  // another network namespace shows, so only its absence means "no netdev".
  std::optional<std::vector<std::string>> SysfsNetdevs(const std::string& device,
                                                       bool& any_net_directory) const {
    const std::string dir = "bus/pci/devices/" + device;
    // Most drivers list the function's netdevs in its own net/: then no child needs a look.
    if (auto own = sysfs_->List(dir + "/net"); own.ok() && !own->empty()) {
      any_net_directory = true;
      return *own;
    }
    // Child devices are directories: a PF's sixty-odd attribute files and its link per VF (and to
    // its driver, group, ...) are passed over without a failed open each, on every prepare.
    auto entries = sysfs_->ListDirectories(dir);
    if (!entries.ok()) return std::nullopt;
    std::vector<std::string> names;
    for (const std::string& entry : *entries) {
      const std::string net = entry == "net" ? dir + "/net" : dir + "/" + entry + "/net";
      auto listed = sysfs_->List(net);
      if (listed.ok()) names.insert(names.end(), listed->begin(), listed->end());
      if (listed.ok() || listed.error().kind != ErrorKind::kNotFound) any_net_directory = true;
    }
    return names;
  }

  std::string netns_path_;
  const sysfs::SysfsReader* sysfs_;  // may be null: every lookup lists the links

  // Sets one field of one VF: RTM_SETLINK with IFLA_VFINFO_LIST { IFLA_VF_INFO { `type` } }.
  template <typename Value>
  static Status Change(Connection& connection, int ifindex, const VfLink& target,
                       const std::string& what, uint16_t type, const Value& value) {
    return Change(connection, ifindex, target, what,
                  [&](nlmsghdr* request) { mnl_attr_put(request, type, sizeof value, &value); });
  }

  // The VLAN tag with its protocol: IFLA_VF_VLAN_LIST { IFLA_VF_VLAN_INFO }, which kernels have
  // had since 4.9 (IFLA_VF_VLAN can only say 802.1Q).
  static Status SetVlan(Connection& connection, int ifindex, const VfLink& target,
                        const VlanTag& tag) {
    ifla_vf_vlan_info value{};
    value.vf = static_cast<uint32_t>(target.vf_index);
    value.vlan = static_cast<uint32_t>(tag.vlan);
    value.qos = static_cast<uint32_t>(tag.qos);
    value.vlan_proto = htons(tag.protocol == VlanProtocol::k8021ad ? ETH_P_8021AD : ETH_P_8021Q);
    VfNetSettings shown;
    shown.vlan = tag.vlan;
    shown.qos = tag.qos;
    shown.vlan_proto = tag.protocol;
    return Change(connection, ifindex, target, shown.Display(), [&](nlmsghdr* request) {
      nlattr* list = mnl_attr_nest_start(request, IFLA_VF_VLAN_LIST);
      mnl_attr_put(request, IFLA_VF_VLAN_INFO, sizeof value, &value);
      mnl_attr_nest_end(request, list);
    });
  }

  // Sets what `put` adds inside IFLA_VFINFO_LIST { IFLA_VF_INFO { ... } }.
  static Status Change(Connection& connection, int ifindex, const VfLink& target,
                       const std::string& what, const std::function<void(nlmsghdr*)>& put) {
    alignas(nlmsghdr) RequestBuffer buffer{};
    nlmsghdr* request = mnl_nlmsg_put_header(buffer.data());
    request->nlmsg_type = RTM_SETLINK;
    request->nlmsg_flags = NLM_F_REQUEST;
    auto* header = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(request, sizeof(ifinfomsg)));
    header->ifi_family = AF_UNSPEC;
    header->ifi_index = ifindex;
    nlattr* list = mnl_attr_nest_start(request, IFLA_VFINFO_LIST);
    nlattr* info = mnl_attr_nest_start(request, IFLA_VF_INFO);
    put(request);
    mnl_attr_nest_end(request, info);
    mnl_attr_nest_end(request, list);
    Status set = Transact(connection, request, "cannot set " + what + " on " + target.Display(),
                          [](const nlmsghdr*) {});
    if (!set.ok() && set.error().kind == ErrorKind::kUnimplemented) {
      Error error = set.error();
      error.message += " (the PF's driver does not support this VF setting)";
      return error;
    }
    return set;
  }
};

}  // namespace

std::unique_ptr<VfNetwork> MakeNetlinkVfNetwork(std::string netns_path,
                                                const sysfs::SysfsReader* sysfs) {
  return std::make_unique<NetlinkVfNetwork>(std::move(netns_path), sysfs);
}

}  // namespace vfio_dra::vfio
