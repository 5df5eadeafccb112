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

std::string VfNetSettings::Display() const {
  std::string out;
  auto add = [&out](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (mac) add("mac " + *mac);
  if (vlan) add("vlan " + std::to_string(*vlan) + (qos ? " qos " + std::to_string(*qos) : ""));
  if (!vlan && qos) add("qos " + std::to_string(*qos));
  if (spoof_check) add(std::string("spoofchk ") + (*spoof_check ? "on" : "off"));
  if (trust) add(std::string("trust ") + (*trust ? "on" : "off"));
  return out.empty() ? "nothing" : out;
}

VfNetSettings VfNetSettings::RestoreFrom(const VfNetSettings& previous) const {
  VfNetSettings out;
  if (mac) out.mac = previous.mac;
  if (vlan || qos) {
    out.vlan = previous.vlan;
    out.qos = previous.vlan ? previous.qos : std::nullopt;
  }
  if (spoof_check) out.spoof_check = previous.spoof_check;
  if (trust) out.trust = previous.trust;
  return out;
}

VfNetSettings VfNetSettings::Unmet(const VfNetSettings& current) const {
  auto differs = [](const auto& want, const auto& have) { return want && want != have; };
  VfNetSettings out;
  if (differs(mac, current.mac)) out.mac = mac;
  // One tag: the VLAN and its priority are set together.
  if (differs(vlan, current.vlan) || (qos && qos != current.qos.value_or(0))) {
    out.vlan = vlan;
    out.qos = qos;
  }
  if (differs(spoof_check, current.spoof_check)) out.spoof_check = spoof_check;
  if (differs(trust, current.trust)) out.trust = trust;
  return out;
}

}  // namespace vfio_dra::vfio
