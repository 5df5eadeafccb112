// vf-net-check: the daemon's VF network code path (VfNetwork over rtnetlink) as a command, so the
// real-kernel tests can drive it against a real driver (netdevsim) and compare with `ip link`.
//   vf-net-check read    --pf-device D --vf N
//   vf-net-check write   --pf-device D --vf N [--mac M] [--vlan V] [--qos Q]
//                        [--vlan-proto 802.1Q|802.1ad] [--spoofchk on|off] [--trust on|off]
//   vf-net-check restore --pf-device D --vf N --previous JSON --applied JSON
//   vf-net-check netdev  --pf-device D        (the PF's netdev, as prepare finds it)
// All take --netns PATH, and --sysfs-root PATH to look a PCI PF's netdev up in sysfs first, as the
// daemon does (without it, every link is listed). Settings are JSON objects {"mac", "vlan", "qos",
// "vlanproto", "spoofchk", "trust"} (null: not reported, or not asked for); read adds "netdev",
// write prints {"previous", "applied"}, the two objects restore takes. Errors go to stderr with
// exit code 1.
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "sysfs/sysfs_reader.h"
#include "vfio/vf_network.h"

namespace {

using nlohmann::json;
using vfio_dra::vfio::VfNetSettings;

template <typename T>
json OrNull(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

json ToJson(const VfNetSettings& settings) {
  return {{"mac", OrNull(settings.mac)},
          {"vlan", OrNull(settings.vlan)},
          {"qos", OrNull(settings.qos)},
          {"vlanproto", settings.vlan_proto
                            ? json(vfio_dra::vfio::VlanProtocolName(*settings.vlan_proto))
                            : json(nullptr)},
          {"spoofchk", OrNull(settings.spoof_check)},
          {"trust", OrNull(settings.trust)}};
}

template <typename T>
void Field(const json& object, const char* key, std::optional<T>& out) {
  if (auto it = object.find(key); it != object.end() && !it->is_null()) out = it->get<T>();
}

// Throws nlohmann's exceptions on text that is not a settings object; main reports them.
VfNetSettings FromJson(const std::string& text) {
  const json object = json::parse(text);
  if (!object.is_object()) throw std::invalid_argument("not a JSON object: " + text);
  VfNetSettings out;
  Field(object, "mac", out.mac);
  Field(object, "vlan", out.vlan);
  Field(object, "qos", out.qos);
  std::optional<std::string> protocol;
  Field(object, "vlanproto", protocol);
  if (protocol) {
    out.vlan_proto = vfio_dra::vfio::ParseVlanProtocol(*protocol);
    if (!out.vlan_proto) throw std::invalid_argument("unknown vlanproto " + *protocol);
  }
  Field(object, "spoofchk", out.spoof_check);
  Field(object, "trust", out.trust);
  return out;
}

std::optional<bool> OnOff(const std::string& text) {
  if (text.empty()) return std::nullopt;
  return text == "on";
}

int Fail(const std::string& message) {
  std::cerr << "vf-net-check: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vf-net-check: read and set an SR-IOV VF's network settings through its PF"};
  app.require_subcommand(1);
  vfio_dra::vfio::VfLink link;
  std::string netns;
  std::string sysfs_root;
  std::string mac;
  std::optional<int> vlan;
  std::optional<int> qos;
  std::string vlan_proto;
  std::string spoofchk;
  std::string trust;
  std::string previous_text;
  std::string applied_text;
  auto* read_cmd = app.add_subcommand("read", "print the VF's settings as the driver reports them");
  auto* write_cmd = app.add_subcommand("write", "set the given settings, print the previous ones");
  auto* restore_cmd = app.add_subcommand("restore", "undo a write");
  auto* netdev_cmd = app.add_subcommand("netdev", "print the PF's netdev");
  for (auto* cmd : {read_cmd, write_cmd, restore_cmd, netdev_cmd}) {
    cmd->add_option("--pf-device", link.pf_device, "the PF's bus device (ethtool bus_info)")
        ->required();
    if (cmd != netdev_cmd) {
      cmd->add_option("--vf", link.vf_index, "the VF's index on its PF")->required();
    }
    cmd->add_option("--netns", netns, "network namespace file to work in (default: our own)");
    cmd->add_option("--sysfs-root", sysfs_root, "look PCI PFs up in this sysfs first");
  }
  write_cmd->add_option("--mac", mac, "MAC address");
  // Not range-checked here: the kernel's or driver's refusal is what the tests look for.
  write_cmd->add_option("--vlan", vlan, "VLAN ID (0: untagged)");
  write_cmd->add_option("--qos", qos, "802.1p priority of the VLAN tag");
  write_cmd->add_option("--vlan-proto", vlan_proto, "protocol of the VLAN tag")
      ->check(CLI::IsMember({"802.1Q", "802.1ad"}));
  write_cmd->add_option("--spoofchk", spoofchk, "spoof checking")
      ->check(CLI::IsMember({"on", "off"}));
  write_cmd->add_option("--trust", trust, "trust")->check(CLI::IsMember({"on", "off"}));
  restore_cmd->add_option("--previous", previous_text, "\"previous\" of the write")->required();
  restore_cmd->add_option("--applied", applied_text, "\"applied\" of the write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::optional<vfio_dra::sysfs::SysfsReader> sysfs;
  if (!sysfs_root.empty()) sysfs.emplace(sysfs_root);
  auto network = vfio_dra::vfio::MakeNetlinkVfNetwork(netns, sysfs ? &*sysfs : nullptr);
  if (netdev_cmd->parsed()) {
    auto netdev = network->PfNetdev(link);
    if (!netdev.ok()) return Fail(netdev.error().message);
    std::cout << json{{"netdev", *netdev}}.dump() << "\n";
    return 0;
  }
  auto current = network->Read(link);
  if (!current.ok()) return Fail(current.error().message);

  if (read_cmd->parsed()) {
    auto netdev = network->PfNetdev(link);
    if (!netdev.ok()) return Fail(netdev.error().message);
    json out = ToJson(*current);
    out["netdev"] = *netdev;
    std::cout << out.dump() << "\n";
    return 0;
  }

  if (write_cmd->parsed()) {
    VfNetSettings wanted;
    if (!mac.empty()) wanted.mac = vfio_dra::vfio::NormalizeMac(mac).value_or(mac);
    wanted.vlan = vlan;
    wanted.qos = qos;
    if (!vlan_proto.empty()) wanted.vlan_proto = vfio_dra::vfio::ParseVlanProtocol(vlan_proto);
    wanted.spoof_check = OnOff(spoofchk);
    wanted.trust = OnOff(trust);
    // Printed even when the write fails: the settings before the refused one stay set, and the
    // caller needs "previous" to undo them.
    std::cout << json{{"previous", ToJson(*current)}, {"applied", ToJson(wanted)}}.dump() << "\n";
    if (vfio_dra::Status s = network->Write(link, wanted); !s.ok()) return Fail(s.error().message);
    return 0;
  }

  VfNetSettings restore;
  try {
    restore = FromJson(applied_text).RestoreFrom(FromJson(previous_text));
  } catch (const std::exception& e) {
    return Fail(std::string("--previous/--applied: ") + e.what());
  }
  std::cout << json{{"restored", ToJson(restore)}}.dump() << "\n";
  if (vfio_dra::Status s = network->Write(link, restore); !s.ok()) return Fail(s.error().message);
  return 0;
}
