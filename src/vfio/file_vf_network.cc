// The simulated kernel's side of VfNetwork (see vf_network.h). One file per VF, so that prepares
// of different VFs of one PF never rewrite each other's state (the kernel serialises them under
// its own lock); `unsupported` lists the settings the simulated driver refuses, one per line
// (mac, vlan, spoofchk, trust).
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/file_io.h"
#include "vfio/vf_network.h"

namespace vfio_dra::vfio {
namespace {

class FileVfNetwork final : public VfNetwork {
 public:
  explicit FileVfNetwork(std::string dir) : dir_(std::move(dir)) {}

  Result<VfNetSettings> Read(const VfLink& link) override {
    auto text = ReadFileToString(PathOf(link));
    if (!text.ok()) {
      return MakeError(ErrorKind::kNotFound, link.Display() + " does not exist (simulated: " +
                                                 text.error().message + ")");
    }
    auto json = nlohmann::json::parse(*text, nullptr, false);
    if (json.is_discarded() || !json.is_object()) {
      return MakeError(ErrorKind::kDataLoss, "simulated VF state " + PathOf(link) + " is corrupt");
    }
    VfNetSettings out;
    if (auto mac = json.find("mac"); mac != json.end() && mac->is_string()) {
      out.mac = NormalizeMac(mac->get<std::string>());
    }
    out.vlan = json.value("vlan", 0);
    out.qos = json.value("qos", 0);
    // As the kernel reports it: always, 802.1Q unless the driver holds another.
    out.vlan_proto = VlanProtocol::k8021Q;
    if (auto v = json.find("vlanProto"); v != json.end()) {
      out.vlan_proto = v->is_string() ? ParseVlanProtocol(v->get<std::string>()) : std::nullopt;
      if (!out.vlan_proto) {
        return MakeError(ErrorKind::kDataLoss, "simulated VF state " + PathOf(link) +
                                                   " has an unknown vlanProto: " + v->dump());
      }
    }
    if (auto v = json.find("spoofchk"); v != json.end() && v->is_boolean()) out.spoof_check = *v;
    if (auto v = json.find("trust"); v != json.end() && v->is_boolean()) out.trust = *v;
    return out;
  }

  Result<std::string> PfNetdev(const VfLink& link) override {
    auto text = ReadFileToString(dir_ + "/" + link.pf_device + "/netdev");
    if (!text.ok()) {
      return MakeError(ErrorKind::kNotFound, "PF " + link.pf_device + " has no network interface");
    }
    std::string name = *text;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return name;
  }

  Status Write(const VfLink& link, const VfNetSettings& settings) override {
    auto current = Read(link);
    if (!current.ok()) return current.error();
    const std::set<std::string> unsupported = Unsupported(link);
    auto refuse = [&](const std::string& what) -> Status {
      if (!unsupported.count(what)) return Status::Ok();
      return MakeError(ErrorKind::kUnimplemented,
                       "cannot set " + what + " on " + link.Display() +
                           ": Operation not supported (the PF's driver does not support this VF "
                           "setting)");
    };
    // Field by field, each persisted before the next, as the kernel applies separate requests.
    VfNetSettings state = *current;
    auto persist = [&]() { return Persist(link, state); };
    if (settings.mac) {
      if (Status s = refuse("mac"); !s.ok()) return s;
      state.mac = *settings.mac;
      if (Status s = persist(); !s.ok()) return s;
    }
    if (settings.SetsTag()) {
      if (Status s = refuse("vlan"); !s.ok()) return s;
      const VlanTag tag = settings.TagOver(state);
      state.vlan = tag.vlan;
      state.qos = tag.qos;
      state.vlan_proto = tag.protocol;
      if (Status s = persist(); !s.ok()) return s;
    }
    if (settings.spoof_check) {
      if (Status s = refuse("spoofchk"); !s.ok()) return s;
      state.spoof_check = *settings.spoof_check;
      if (Status s = persist(); !s.ok()) return s;
    }
    if (settings.trust) {
      if (Status s = refuse("trust"); !s.ok()) return s;
      state.trust = *settings.trust;
      if (Status s = persist(); !s.ok()) return s;
    }
    return Status::Ok();
  }

 private:
  std::string PathOf(const VfLink& link) const {
    return dir_ + "/" + link.pf_device + "/vf" + std::to_string(link.vf_index) + ".json";
  }

  std::set<std::string> Unsupported(const VfLink& link) const {
    std::set<std::string> out;
    auto text = ReadFileToString(dir_ + "/" + link.pf_device + "/unsupported");
    if (!text.ok()) return out;
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) out.insert(line);
    }
    return out;
  }

  Status Persist(const VfLink& link, const VfNetSettings& state) const {
    nlohmann::json json = {{"vlan", state.vlan.value_or(0)}, {"qos", state.qos.value_or(0)}};
    if (state.mac) json["mac"] = *state.mac;
    if (state.vlan_proto == VlanProtocol::k8021ad) json["vlanProto"] = "802.1ad";
    if (state.spoof_check) json["spoofchk"] = *state.spoof_check;
    if (state.trust) json["trust"] = *state.trust;
    return WriteFileAtomically(PathOf(link), json.dump() + "\n", 0644, Durability::kVolatile);
  }

  std::string dir_;
};

}  // namespace

std::unique_ptr<VfNetwork> MakeFileVfNetwork(std::string dir) {
  return std::make_unique<FileVfNetwork>(std::move(dir));
}

}  // namespace vfio_dra::vfio
