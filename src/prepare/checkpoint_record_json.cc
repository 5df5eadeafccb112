// See checkpoint_record_json.h.
#include "prepare/checkpoint_record_json.h"

#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {
namespace {

using nlohmann::json;
// Records are written with ordered_json, which keeps the members in the order written: the order
// docs/checkpoint.md shows, for people reading a record. Readers do not depend on it.
using OrderedJson = nlohmann::ordered_json;

const char* StateName(PrepareState state) {
  return state == PrepareState::kPrepareCompleted ? "PrepareCompleted" : "PrepareStarted";
}

PrepareState ParseState(const std::string& state) {
  if (state == "PrepareStarted") return PrepareState::kPrepareStarted;
  if (state == "PrepareCompleted") return PrepareState::kPrepareCompleted;
  throw json::other_error::create(501, "unknown state \"" + state + "\"", nullptr);
}

OrderedJson IdentityJson(const PciIdentity& identity) {
  OrderedJson out = OrderedJson::object();
  out["vendor"] = identity.vendor;
  out["device"] = identity.device;
  out["subsystemVendor"] = identity.subsystem_vendor;
  out["subsystemDevice"] = identity.subsystem_device;
  return out;
}

OrderedJson FunctionsJson(const std::vector<FunctionRecord>& functions) {
  OrderedJson out = OrderedJson::array();
  for (const FunctionRecord& f : functions) {
    OrderedJson entry = OrderedJson::object();
    entry["address"] = f.address;
    entry["originalDriver"] = f.driver;
    entry["originalOverride"] = f.override;
    entry["wasOnVfio"] = f.was_on_vfio;
    entry["vfioDriver"] = f.vfio_driver;
    if (f.identity.Known()) entry["identity"] = IdentityJson(f.identity);
    out.push_back(std::move(entry));
  }
  return out;
}

std::string OptionalString(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

PciIdentity IdentityFromJson(const json& identity) {
  return {identity.at("vendor").get<std::string>(), identity.at("device").get<std::string>(),
          OptionalString(identity, "subsystemVendor"), OptionalString(identity, "subsystemDevice")};
}

FunctionRecord FunctionFromJson(const json& f) {
  FunctionRecord r;
  r.address = f.at("address").get<std::string>();
  r.driver = f.at("originalDriver").get<std::string>();
  r.override = f.at("originalOverride").get<std::string>();
  r.was_on_vfio = f.at("wasOnVfio").get<bool>();
  if (std::string vfio_driver = OptionalString(f, "vfioDriver"); !vfio_driver.empty()) {
    if (!sysfs::IsDriverName(vfio_driver)) {
      throw json::other_error::create(
          501, "vfioDriver \"" + vfio_driver + "\" is not a driver name", nullptr);
    }
    r.vfio_driver = std::move(vfio_driver);
  }
  if (auto it = f.find("identity"); it != f.end()) r.identity = IdentityFromJson(*it);
  return r;
}

OrderedJson MdevsJson(const std::vector<MdevRecord>& mdevs) {
  OrderedJson out = OrderedJson::array();
  for (const MdevRecord& m : mdevs) {
    OrderedJson entry = OrderedJson::object();
    entry["parent"] = m.parent;
    entry["type"] = m.type_id;
    entry["uuid"] = m.uuid;
    entry["createdByUs"] = m.created_by_us;
    out.push_back(std::move(entry));
  }
  return out;
}

MdevRecord MdevFromJson(const json& m) {
  return MdevRecord{m.at("parent").get<std::string>(), m.at("type").get<std::string>(),
                    m.at("uuid").get<std::string>(), m.at("createdByUs").get<bool>()};
}

OrderedJson VgpusJson(const std::vector<VgpuRecord>& vgpus) {
  OrderedJson out = OrderedJson::array();
  for (const VgpuRecord& v : vgpus) {
    OrderedJson entry = OrderedJson::object();
    entry["address"] = v.address;
    entry["type"] = v.type_id;
    entry["createdByUs"] = v.created_by_us;
    entry["identity"] = IdentityJson(v.identity);
    // Optional: a build that does not know it reads the record as before.
    if (!v.pf.empty()) entry["pf"] = v.pf;
    out.push_back(std::move(entry));
  }
  return out;
}

VgpuRecord VgpuFromJson(const json& v) {
  return VgpuRecord{v.at("address").get<std::string>(), v.at("type").get<int>(),
                    v.at("createdByUs").get<bool>(), IdentityFromJson(v.at("identity")),
                    OptionalString(v, "pf")};
}

// Only the fields that are set: an absent field is one the driver did not report (previous) or
// prepare does not change (applied).
OrderedJson SettingsJson(const vfio::VfNetSettings& settings) {
  OrderedJson out = OrderedJson::object();
  if (settings.mac) out["mac"] = *settings.mac;
  if (settings.vlan) out["vlan"] = *settings.vlan;
  if (settings.qos) out["qos"] = *settings.qos;
  if (settings.vlan_proto) out["vlanProtocol"] = vfio::VlanProtocolName(*settings.vlan_proto);
  if (settings.spoof_check) out["spoofChk"] = *settings.spoof_check;
  if (settings.trust) out["trust"] = *settings.trust;
  return out;
}

vfio::VfNetSettings SettingsFromJson(const json& j) {
  vfio::VfNetSettings out;
  if (auto it = j.find("mac"); it != j.end()) out.mac = it->get<std::string>();
  if (auto it = j.find("vlan"); it != j.end()) out.vlan = it->get<int>();
  if (auto it = j.find("qos"); it != j.end()) out.qos = it->get<int>();
  // Absent in records written before protocols were recorded: a `previous` VLAN is then 802.1Q
  // (see VfNetSettings::RestoreFrom).
  if (auto it = j.find("vlanProtocol"); it != j.end()) {
    out.vlan_proto = vfio::ParseVlanProtocol(it->get<std::string>());
    if (!out.vlan_proto) {
      throw json::other_error::create(
          501, "unknown vlanProtocol \"" + it->get<std::string>() + "\"", nullptr);
    }
  }
  if (auto it = j.find("spoofChk"); it != j.end()) out.spoof_check = it->get<bool>();
  if (auto it = j.find("trust"); it != j.end()) out.trust = it->get<bool>();
  return out;
}

OrderedJson LinkJson(const vfio::VfLink& link) {
  OrderedJson out = OrderedJson::object();
  out["pfDevice"] = link.pf_device;
  out["vfIndex"] = link.vf_index;
  return out;
}

vfio::VfLink LinkFromJson(const json& j) {
  return {j.at("pfDevice").get<std::string>(), j.at("vfIndex").get<int>()};
}

OrderedJson VfNetworksJson(const std::vector<VfNetworkRecord>& records) {
  OrderedJson out = OrderedJson::array();
  for (const VfNetworkRecord& r : records) {
    OrderedJson entry = OrderedJson::object();
    entry["address"] = r.address;
    entry["link"] = LinkJson(r.link);
    entry["previous"] = SettingsJson(r.previous);
    entry["applied"] = SettingsJson(r.applied);
    out.push_back(std::move(entry));
  }
  return out;
}

VfNetworkRecord VfNetworkFromJson(const json& j) {
  return {j.at("address").get<std::string>(), LinkFromJson(j.at("link")),
          SettingsFromJson(j.at("previous")), SettingsFromJson(j.at("applied"))};
}

// In the order docs/checkpoint.md shows: what was allocated, where it is, then how it was handed
// out.
OrderedJson DeviceJson(const RecordedDevice& d) {
  OrderedJson out = OrderedJson::object();
  out["request"] = d.request;
  out["pool"] = d.pool;
  out["device"] = d.device;
  if (d.share_id) out["shareID"] = *d.share_id;
  out["kind"] = d.is_mdev ? "mdev" : d.is_vgpu ? "vgpu" : "pci";
  if (d.is_vgpu) {
    out["address"] = d.address;
    out["vgpuType"] = d.vgpu_type;
    if (d.iommu_group) out["iommuGroup"] = *d.iommu_group;
  } else if (d.is_mdev) {
    OrderedJson mdev = OrderedJson::object();
    mdev["parent"] = d.mdev.parent;
    mdev["type"] = d.mdev.type_id;
    mdev["uuid"] = d.mdev.uuid;
    out["mdev"] = std::move(mdev);
    out["createdByDriver"] = d.mdev_created_by_driver;
  } else {
    out["address"] = d.address;
    out["functions"] = d.functions;
    if (d.iommu_group) out["iommuGroup"] = *d.iommu_group;
    if (d.vf_link) {
      out["vfLink"] = LinkJson(*d.vf_link);
      out["network"] = SettingsJson(d.network);
    }
  }
  out["iommuInterface"] = d.iommu_interface;
  OrderedJson attributes = OrderedJson::object();
  for (const auto& [name, value] : d.attributes) attributes[name] = OrderedJson(value);
  out["attributes"] = std::move(attributes);
  out["cdiDeviceIDs"] = d.cdi_device_ids;
  return out;
}

RecordedDevice DeviceFromJson(const json& j) {
  RecordedDevice d;
  d.request = j.at("request").get<std::string>();
  d.pool = j.at("pool").get<std::string>();
  d.device = j.at("device").get<std::string>();
  const std::string kind = j.at("kind").get<std::string>();
  if (kind != "pci" && kind != "mdev" && kind != "vgpu") {
    throw json::other_error::create(501, "unknown device kind \"" + kind + "\"", nullptr);
  }
  d.is_mdev = kind == "mdev";
  d.is_vgpu = kind == "vgpu";
  d.iommu_interface = j.at("iommuInterface").get<std::string>();
  d.attributes = j.at("attributes").get<std::map<std::string, json>>();
  d.cdi_device_ids = j.at("cdiDeviceIDs").get<std::vector<std::string>>();
  if (auto it = j.find("shareID"); it != j.end()) d.share_id = it->get<std::string>();
  if (d.is_vgpu) {
    d.address = j.at("address").get<std::string>();
    d.vgpu_type = j.at("vgpuType").get<int>();
    if (auto it = j.find("iommuGroup"); it != j.end()) d.iommu_group = it->get<int>();
  } else if (d.is_mdev) {
    const json& m = j.at("mdev");
    d.mdev = {m.at("parent").get<std::string>(), m.at("type").get<std::string>(),
              m.at("uuid").get<std::string>()};
    d.mdev_created_by_driver = j.at("createdByDriver").get<bool>();
  } else {
    d.address = j.at("address").get<std::string>();
    d.functions = j.at("functions").get<std::vector<std::string>>();
    if (auto it = j.find("iommuGroup"); it != j.end()) d.iommu_group = it->get<int>();
    // Absent in records written before VF network settings (still version 2: the fields are
    // optional, and an older version reading them only misses the settings it never made).
    if (auto it = j.find("vfLink"); it != j.end()) d.vf_link = LinkFromJson(*it);
    if (auto it = j.find("network"); it != j.end()) d.network = SettingsFromJson(*it);
  }
  return d;
}

// The fields version 1 and version 2 records name alike.
void ReadClaimFields(const json& j, ClaimRecord& r) {
  r.namespace_ = j.at("namespace").get<std::string>();
  r.name = j.at("name").get<std::string>();
  r.state = ParseState(j.at("state").get<std::string>());
  for (const json& f : j.at("functions")) r.functions.push_back(FunctionFromJson(f));
  for (const json& m : j.at("mdevs")) r.mdevs.push_back(MdevFromJson(m));
  if (auto it = j.find("vgpus"); it != j.end()) {
    for (const json& v : *it) r.vgpus.push_back(VgpuFromJson(v));
  }
  if (auto it = j.find("vfNetworks"); it != j.end()) {
    for (const json& v : *it) r.vf_networks.push_back(VfNetworkFromJson(v));
  }
  r.cdi_files = j.at("cdiFiles").get<std::vector<std::string>>();
}

}  // namespace

Result<std::string> RecordText(const ClaimRecord& r) {
  OrderedJson devices = OrderedJson::array();
  for (const RecordedDevice& d : r.devices) devices.push_back(DeviceJson(d));
  OrderedJson claim = OrderedJson::object();
  claim["uid"] = r.uid;
  claim["namespace"] = r.namespace_;
  claim["name"] = r.name;
  claim["state"] = StateName(r.state);
  claim["functions"] = FunctionsJson(r.functions);
  claim["mdevs"] = MdevsJson(r.mdevs);
  if (!r.vgpus.empty()) claim["vgpus"] = VgpusJson(r.vgpus);
  claim["vfNetworks"] = VfNetworksJson(r.vf_networks);
  claim["cdiFiles"] = r.cdi_files;
  claim["devices"] = std::move(devices);
  claim["replayable"] = r.replayable;
  OrderedJson root = OrderedJson::object();
  root["version"] = r.vgpus.empty() ? kCheckpointVersionWithoutVgpus : kCheckpointVersion;
  root["bootID"] = r.boot_id;
  root["claim"] = std::move(claim);
  std::string text;
  try {
    // dump's default, strict handling of bytes that are not UTF-8 (in a key too): type_error 316,
    // the only error it raises, where a replacing handler would record something else.
    text = root.dump(1);
  } catch (const OrderedJson::type_error&) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "the record of " + r.Display() +
                         " holds a value that is not UTF-8 (a driver name or driver_override "
                         "read from sysfs, say); it cannot be recorded as it is, so nothing is "
                         "done for the claim");
  }
  text.push_back('\n');
  return text;
}

ClaimRecord RecordFromJson(const json& root) {
  const int version = root.at("version").get<int>();
  if (version != kCheckpointVersion && version != kCheckpointVersionWithoutVgpus) {
    throw json::other_error::create(502,
                                    "unknown checkpoint version " + std::to_string(version) +
                                        " (this build reads " + std::to_string(kCheckpointVersion) +
                                        ")",
                                    nullptr);
  }
  const json& j = root.at("claim");
  ClaimRecord r;
  r.boot_id = root.at("bootID").get<std::string>();
  r.uid = j.at("uid").get<std::string>();
  ReadClaimFields(j, r);
  for (const json& d : j.at("devices")) r.devices.push_back(DeviceFromJson(d));
  r.replayable = j.at("replayable").get<bool>();
  return r;
}

ClaimRecord RecordFromVersion1(const std::string& uid, const std::string& boot_id, const json& j) {
  ClaimRecord r;
  r.uid = uid;
  r.boot_id = boot_id;
  ReadClaimFields(j, r);
  r.replayable = false;
  const json& response = j.at("response");
  if (!response.is_array()) return r;
  for (const json& entry : response) {
    if (!entry.is_object()) continue;
    RecordedDevice d;
    if (auto requests = entry.find("requests"); requests != entry.end() && requests->is_array() &&
                                                !requests->empty() &&
                                                requests->front().is_string()) {
      d.request = requests->front().get<std::string>();
    }
    d.pool = OptionalString(entry, "pool");
    d.device = OptionalString(entry, "device");
    if (auto share = entry.find("shareID"); share != entry.end() && share->is_string()) {
      d.share_id = share->get<std::string>();
    }
    if (auto ids = entry.find("cdiDeviceIDs"); ids != entry.end() && ids->is_array()) {
      for (const json& id : *ids) {
        if (id.is_string()) d.cdi_device_ids.push_back(id.get<std::string>());
      }
    }
    d.mdev.uuid = OptionalString(entry, "mdevUUID");
    d.is_mdev = !d.mdev.uuid.empty();
    if (auto functions = entry.find("functions");
        functions != entry.end() && functions->is_array()) {
      for (const json& f : *functions) {
        if (f.is_string()) d.functions.push_back(f.get<std::string>());
      }
    } else if (!d.is_mdev) {
      // The oldest entries did not say which functions a device holds: all of the claim's.
      for (const FunctionRecord& f : r.functions) d.functions.push_back(f.address);
    }
    if (!d.functions.empty()) d.address = d.functions.front();
    r.devices.push_back(std::move(d));
  }
  return r;
}

}  // namespace vfio_dra::prepare
