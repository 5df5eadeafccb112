#include "vfio/vf_network.h"

#include <cctype>

namespace vfio_dra::vfio {

std::optional<std::string> NormalizeMac(const std::string& text) {
  if (text.size() != 17) return std::nullopt;
  std::string out = text;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (i % 3 == 2) {
      if (c != ':') return std::nullopt;
    } else {
      if (!std::isxdigit(c)) return std::nullopt;
      out[i] = static_cast<char>(std::tolower(c));
    }
  }
  return out;
}

const char* VlanProtocolName(VlanProtocol protocol) {
  return protocol == VlanProtocol::k8021ad ? "802.1ad" : "802.1Q";
}

std::optional<VlanProtocol> ParseVlanProtocol(const std::string& name) {
  if (name == "802.1Q") return VlanProtocol::k8021Q;
  if (name == "802.1ad") return VlanProtocol::k8021ad;
  return std::nullopt;
}

std::string VfNetSettings::Display() const {
  std::string out;
  auto add = [&out](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (mac) add("mac " + *mac);
  const std::string proto = vlan_proto == VlanProtocol::k8021ad ? "proto 802.1ad" : "";
  const std::string qos_text = qos ? "qos " + std::to_string(*qos) : "";
  std::string tag = vlan ? "vlan " + std::to_string(*vlan) : "";
  for (const std::string& part : {qos_text, proto}) {
    if (!part.empty()) tag += (tag.empty() ? "" : " ") + part;
  }
  if (!tag.empty()) add(tag);
  if (spoof_check) add(std::string("spoofchk ") + (*spoof_check ? "on" : "off"));
  if (trust) add(std::string("trust ") + (*trust ? "on" : "off"));
  return out.empty() ? "nothing" : out;
}

VfNetSettings VfNetSettings::RestoreFrom(const VfNetSettings& previous) const {
  VfNetSettings out;
  if (mac) out.mac = previous.mac;
  if (SetsTag() && previous.vlan) {
    out.vlan = previous.vlan;
    out.qos = previous.qos.value_or(0);
    out.vlan_proto = previous.vlan_proto.value_or(VlanProtocol::k8021Q);
  }
  if (spoof_check) out.spoof_check = previous.spoof_check;
  if (trust) out.trust = previous.trust;
  return out;
}

VfNetSettings VfNetSettings::Unmet(const VfNetSettings& current) const {
  auto differs = [](const auto& want, const auto& have) { return want && want != have; };
  VfNetSettings out;
  if (differs(mac, current.mac)) out.mac = mac;
  // One tag: its parts are set together.
  if (differs(vlan, current.vlan) || (qos && qos != current.qos.value_or(0)) ||
      (vlan_proto && vlan_proto != current.vlan_proto.value_or(VlanProtocol::k8021Q))) {
    out.vlan = vlan;
    out.qos = qos;
    out.vlan_proto = vlan_proto;
  }
  if (differs(spoof_check, current.spoof_check)) out.spoof_check = spoof_check;
  if (differs(trust, current.trust)) out.trust = trust;
  return out;
}

VlanTag VfNetSettings::TagOver(const VfNetSettings& current) const {
  VlanTag tag;
  tag.vlan = vlan.value_or(current.vlan.value_or(0));
  // A priority or a protocol without a VLAN would tag what was asked to go untagged.
  const bool untagged = tag.vlan == 0;
  tag.qos = qos.value_or(untagged ? 0 : current.qos.value_or(0));
  tag.protocol = vlan_proto.value_or(untagged ? VlanProtocol::k8021Q
                                              : current.vlan_proto.value_or(VlanProtocol::k8021Q));
  return tag;
}

}  // namespace vfio_dra::vfio
