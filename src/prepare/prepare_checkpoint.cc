#include "prepare/prepare_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <memory>

#include "base/file_io.h"
#include "base/k8s_names.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {
namespace {

using nlohmann::json;
// Records are written with ordered_json, which keeps the members in the order written: the order
// docs/checkpoint.md shows, for people reading a record. Readers do not depend on it.
using OrderedJson = nlohmann::ordered_json;

constexpr size_t kMaxRecordBytes = 4 << 20;
constexpr const char* kSuffix = ".json";

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
    out.push_back(std::move(entry));
  }
  return out;
}

VgpuRecord VgpuFromJson(const json& v) {
  return VgpuRecord{v.at("address").get<std::string>(), v.at("type").get<int>(),
                    v.at("createdByUs").get<bool>(), IdentityFromJson(v.at("identity"))};
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

// The record file's text. An error when a value is not UTF-8 (a driver name or driver_override
// read from sysfs can be any bytes): it would be recorded as something else, and undone wrongly.
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

// Throws nlohmann::json exceptions on a wrong shape; the caller turns them into "corrupt".
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

// A version-1 entry: the answer was raw JSON and devices carried no plan.
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

// Gives the file at `path` a name of its own beside it, "<path>.corrupt-<seconds>" (with "-2",
// "-3", ... when an earlier move in the same second took that name): link(2) never replaces a
// name, so a copy moved aside before is never overwritten. The caller makes sure the file at
// `path` is the one it means to move.
Result<std::string> MoveToUniqueAside(const std::string& path) {
  const std::string base = path + ".corrupt-" + std::to_string(std::time(nullptr));
  constexpr int kMaxNames = 1000;
  for (int n = 1; n <= kMaxNames; ++n) {
    const std::string aside = n == 1 ? base : base + "-" + std::to_string(n);
    if (::link(path.c_str(), aside.c_str()) != 0) {
      if (errno == EEXIST) continue;
      return MakeError(ErrorKind::kUnavailable,
                       "cannot link it to " + aside + ": " + ErrnoText(errno));
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return MakeError(ErrorKind::kUnavailable,
                       "linked it to " + aside + " but cannot unlink it: " + ErrnoText(errno));
    }
    return aside;
  }
  return MakeError(ErrorKind::kUnavailable,
                   "every name " + base + "[-N] up to " + std::to_string(kMaxNames) + " is taken");
}

// The problem text for the log of an unusable record, moved aside or not.
std::string UnusableText(const std::string& path, const std::string& reason,
                         const Result<std::string>& moved, const std::string& consequence) {
  if (!moved.ok()) {
    return "the prepare checkpoint record " + path + " is unusable (" + reason +
           ") and cannot be moved aside: " + moved.error().message + "; " + consequence;
  }
  return "the prepare checkpoint record " + path + " is unusable (" + reason + "); moved it to " +
         *moved + "; " + consequence;
}

// The claim uid a file name in the directory is the record of, if any (not temporary files).
std::optional<std::string> UidOfRecordFile(const std::string& name) {
  if (name.size() <= 5 || name.compare(name.size() - 5, 5, kSuffix) != 0) return std::nullopt;
  std::string uid = name.substr(0, name.size() - 5);
  if (!IsObjectUid(uid)) return std::nullopt;
  return uid;
}

}  // namespace

std::string PciIdentity::Display() const {
  std::string out = vendor + ":" + device;
  if (!subsystem_vendor.empty()) {
    out += " (subsystem " + subsystem_vendor + ":" + subsystem_device + ")";
  }
  return out;
}

FunctionRecord FunctionRecord::From(const vfio::OriginalBinding& binding, PciIdentity identity) {
  return FunctionRecord{binding.address,     binding.driver,      binding.override,
                        binding.was_on_vfio, std::move(identity), binding.vfio_driver};
}

std::string ClaimRecord::Display() const {
  return "claim " + namespace_ + "/" + name + " (uid " + uid + ")";
}

const ClaimRecord* CheckpointView::Find(const std::string& uid) const {
  auto it = claims.find(uid);
  return it == claims.end() ? nullptr : it->second.get();
}

Result<PrepareCheckpoint> PrepareCheckpoint::Open(const std::string& data_dir,
                                                  std::string boot_id) {
  const std::string dir = data_dir + "/" + kClaimsDirectory;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return MakeError(ErrorKind::kUnavailable, "cannot create the prepare checkpoint directory " +
                                                  dir + ": " + ErrnoText(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "the prepare checkpoint directory " + dir + " is not a directory");
  }
  return PrepareCheckpoint(data_dir, dir, std::move(boot_id));
}

std::string PrepareCheckpoint::PathOf(const std::string& uid) const {
  return dir_ + "/" + uid + kSuffix;
}

Result<std::optional<ClaimRecord>> PrepareCheckpoint::Find(const std::string& uid) const {
  auto record = Read(uid);
  if (!record.ok()) return record.error();
  if (*record == nullptr) return std::optional<ClaimRecord>();
  return std::optional<ClaimRecord>(**record);
}

Result<std::shared_ptr<const ClaimRecord>> PrepareCheckpoint::Read(const std::string& uid,
                                                                   int dir_fd,
                                                                   FileRead* file) const {
  using Shared = std::shared_ptr<const ClaimRecord>;
  if (!IsObjectUid(uid)) return Shared();
  const std::string path = PathOf(uid);
  // Stat'ed and read through one descriptor: the version a caller may act on (move a corrupt
  // record aside) is the version of what was read.
  const int fd = dir_fd >= 0 ? ::openat(dir_fd, (uid + kSuffix).c_str(), O_RDONLY | O_CLOEXEC)
                             : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      std::lock_guard<std::mutex> lock(parsed_->mu);
      parsed_->by_uid.erase(uid);
      return Shared();
    }
    return MakeError(ErrorKind::kUnavailable,
                     "cannot read the prepare checkpoint record of claim "
                     "uid " +
                         uid + ": " + path + ": " + ErrnoText(errno));
  }
  std::unique_ptr<int, void (*)(int*)> open_file(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return MakeError(ErrorKind::kUnavailable,
                     "cannot read the prepare checkpoint record of claim uid " + uid + ": " + path +
                         ": " + ErrnoText(errno));
  }
  const FileVersion version = FileVersion::Of(st);
  if (file != nullptr) *file = FileRead{version, st.st_size == 0};
  // Only a power loss between Stage and Commit leaves an empty record (every write renames a
  // complete file into place), and nothing acts on a record before its Commit: it counts as none.
  if (st.st_size == 0) return Shared();
  {
    std::lock_guard<std::mutex> lock(parsed_->mu);
    auto it = parsed_->by_uid.find(uid);
    if (it != parsed_->by_uid.end() && it->second.first == version) {
      return it->second.second;
    }
  }
  auto text = ReadOpenFileToString(fd, path, kMaxRecordBytes);
  if (!text.ok()) {
    return text.error().Wrap("cannot read the prepare checkpoint record of claim uid " + uid);
  }
  try {
    const json root = json::parse(*text);
    if (auto v = root.find("version");
        v != root.end() && v->is_number_integer() && v->get<int>() > kCheckpointVersion) {
      // Written by a newer vfio-dra (the other instance of a rolling update, or before a
      // downgrade): it may record work this build cannot undo, so it is neither used nor moved
      // aside; the newer instance handles the claim.
      return MakeError(ErrorKind::kUnavailable,
                       "the prepare checkpoint record " + path + " has version " +
                           std::to_string(v->get<int>()) +
                           ", written by a newer vfio-dra (this "
                           "build reads version " +
                           std::to_string(kCheckpointVersion) +
                           "); it is kept for the newer version to handle");
    }
    auto record = std::make_shared<const ClaimRecord>(RecordFromJson(root));
    if (record->uid != uid) {
      throw json::other_error::create(503, "it names claim uid " + record->uid, nullptr);
    }
    std::lock_guard<std::mutex> lock(parsed_->mu);
    parsed_->by_uid[uid] = {version, record};
    return Shared(std::move(record));
  } catch (const json::exception& e) {
    return MakeError(ErrorKind::kDataLoss,
                     "the prepare checkpoint record " + path + " is unusable: " + e.what());
  }
}

Result<std::optional<FileLock>> PrepareCheckpoint::LockRecords(LockMode mode) const {
  const std::string path = data_dir_ + "/" + kRecordsLockFile;
  if (mode == LockMode::kExclusive) return FileLock::TryAcquire(path, mode);
  auto held = FileLock::Acquire(path, mode, Deadline::After(kRecordsLockWait),
                                "the prepare checkpoint's records lock " + path);
  if (!held.ok()) return held.error();
  return std::optional<FileLock>(std::move(*held));
}

Result<std::optional<std::string>> PrepareCheckpoint::Retire(const std::string& uid,
                                                             const FileVersion& version,
                                                             bool keep_copy) const {
  using Outcome = std::optional<std::string>;
  auto held = LockRecords(LockMode::kExclusive);
  if (!held.ok()) return held.error();
  if (!*held) return Outcome();  // a write is landing: it may be this very record
  const std::string path = PathOf(uid);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Outcome();
    return MakeError(ErrorKind::kUnavailable, "cannot stat it: " + ErrnoText(errno));
  }
  if (!(FileVersion::Of(st) == version)) return Outcome();  // replaced since it was read
  if (!keep_copy) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return MakeError(ErrorKind::kUnavailable, "cannot unlink it: " + ErrnoText(errno));
    }
    return Outcome(std::string());
  }
  auto aside = MoveToUniqueAside(path);
  if (!aside.ok()) return aside.error();
  return Outcome(std::move(*aside));
}

void PrepareCheckpoint::LoadRecord(RecordIndex& index, const std::string& uid, int dir_fd,
                                   CheckpointView& view) const {
  index.records.erase(uid);
  index.retry.erase(uid);
  FileRead file;
  auto record = Read(uid, dir_fd, &file);
  const std::string path = PathOf(uid);
  if (record.ok() && *record == nullptr && file.empty) {
    auto dropped = Retire(uid, file.version, /*keep_copy=*/false);
    if (dropped.ok() && dropped->has_value()) {
      view.problems.push_back("removed the empty prepare checkpoint record " + path +
                              ": a power loss came before the record of that prepare reached "
                              "the disk, so nothing was done for it");
    } else {
      // Replaced meanwhile, or a write is landing: read again at the next Load.
      index.retry.insert(uid);
      if (!dropped.ok()) {
        view.problems.push_back("cannot remove the empty prepare checkpoint record " + path + ": " +
                                dropped.error().message);
      }
    }
    return;
  }
  if (record.ok()) {
    if (*record) index.records.emplace(uid, std::move(*record));
    return;
  }
  index.retry.insert(uid);
  if (record.error().kind == ErrorKind::kDataLoss) {
    const std::string consequence =
        "the claim's devices cannot be undone automatically, check them by hand";
    auto moved = Retire(uid, file.version, /*keep_copy=*/true);
    if (moved.ok() && moved->has_value()) {
      index.retry.erase(uid);
      view.problems.push_back(UnusableText(path, record.error().message, **moved, consequence));
      return;
    }
    // Not moved (it changed since it was read, a write is landing, or the move failed): it
    // still may hold any device, so it is reported as unreadable until it is read again.
    view.unreadable[uid] = record.error().message;
    if (!moved.ok()) {
      view.problems.push_back(
          UnusableText(path, record.error().message, moved.error(), consequence));
    }
    return;
  }
  view.unreadable[uid] = record.error().message;
  view.problems.push_back(record.error().message +
                          "; the claim is kept and retried on its next prepare or unprepare");
}

CheckpointView PrepareCheckpoint::Load() const {
  CheckpointView view;
  RecordIndex& index = *index_;
  std::lock_guard<std::mutex> lock(index.mu);
  // Taken before anything is read: a change made while this Load reads is read again by the next.
  DirectoryChanges::Batch changed = index.changes.Take();
  if (!changed.everything && index.complete) {
    // The batch is gone from the kernel's queue: until every record it names is read, the index
    // is not to be trusted (an exception on the way leaves the next Load to read everything).
    index.complete = false;
    std::set<std::string> uids = index.retry;
    for (const std::string& name : changed.names) {
      if (auto uid = UidOfRecordFile(name)) uids.insert(std::move(*uid));
    }
    for (const std::string& uid : uids) LoadRecord(index, uid, -1, view);
    index.complete = true;
    view.claims = index.records;
    return view;
  }
  index.complete = false;
  index.records.clear();
  index.retry.clear();
  DIR* dir = ::opendir(dir_.c_str());
  if (dir == nullptr) {
    view.listing_error =
        "cannot list the prepare checkpoint directory " + dir_ + ": " + ErrnoText(errno);
    view.problems.push_back(*view.listing_error);
    return view;
  }
  // Open until the records are read: they are looked up relative to it.
  std::unique_ptr<DIR, int (*)(DIR*)> open_dir(dir, &::closedir);
  std::vector<std::string> uids;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) break;
    if (auto uid = UidOfRecordFile(entry->d_name)) uids.push_back(std::move(*uid));
  }
  if (errno != 0) {
    // A listing cut short would leave records out of the index until they are written again.
    view.listing_error =
        "cannot list the prepare checkpoint directory " + dir_ + ": " + ErrnoText(errno);
    view.problems.push_back(*view.listing_error);
    return view;
  }
  for (const std::string& uid : uids) LoadRecord(index, uid, ::dirfd(dir), view);
  index.complete = true;
  view.claims = index.records;
  return view;
}

Result<std::shared_ptr<const ClaimRecord>> PrepareCheckpoint::Write(ClaimRecord record,
                                                                    Durability durability) const {
  if (!IsObjectUid(record.uid)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "cannot record claim uid \"" + record.uid + "\": not an object UID");
  }
  record.boot_id = boot_id_;
  const std::string path = PathOf(record.uid);
  auto text = RecordText(record);
  if (!text.ok()) return text.error().Wrap("cannot write the prepare checkpoint");
  auto records_lock = LockRecords(LockMode::kShared);
  if (!records_lock.ok()) return records_lock.error().Wrap("cannot write the prepare checkpoint");
  Status status = WriteFileAtomically(path, *text, 0600, durability);
  if (!status.ok()) return status.error().Wrap("cannot write the prepare checkpoint");
  auto written = std::make_shared<const ClaimRecord>(std::move(record));
  // What was written needs no parsing when the next Load meets it. A claim's record is written
  // only by the holder of its devices' locks, so the file now at `path` is this one; if it is
  // replaced later, its version differs and it is parsed then.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    std::lock_guard<std::mutex> lock(parsed_->mu);
    parsed_->by_uid[written->uid] = {FileVersion::Of(st), written};
  }
  if (durability == Durability::kDataOnly) status = dir_sync_->Sync();
  if (!status.ok()) return status.error().Wrap("cannot write the prepare checkpoint");
  return written;
}

Result<std::shared_ptr<const ClaimRecord>> PrepareCheckpoint::Put(ClaimRecord record) const {
  return Write(std::move(record), Durability::kDataOnly);
}

Status PrepareCheckpoint::Stage(ClaimRecord record) const {
  auto written = Write(std::move(record), Durability::kVolatile);
  if (!written.ok()) return written.error();
  return Status::Ok();
}

Status PrepareCheckpoint::Commit(const std::string& uid) const {
  const std::string path = PathOf(uid);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return MakeError(ErrorKind::kUnavailable, "cannot make the prepare checkpoint record " + path +
                                                  " durable: " + ErrnoText(errno));
  }
  const int synced = ::fsync(fd);
  const int fsync_errno = errno;
  ::close(fd);
  if (synced != 0) {
    return MakeError(ErrorKind::kUnavailable, "cannot make the prepare checkpoint record " + path +
                                                  " durable: fsync: " + ErrnoText(fsync_errno));
  }
  if (Status s = dir_sync_->Sync(); !s.ok()) {
    return s.error().Wrap("cannot make the prepare checkpoint record " + path + " durable");
  }
  return Status::Ok();
}

Status PrepareCheckpoint::Remove(const std::string& uid) const {
  if (!IsObjectUid(uid)) return Status::Ok();
  {
    auto records_lock = LockRecords(LockMode::kShared);
    if (!records_lock.ok()) {
      return records_lock.error().Wrap("cannot remove the prepare checkpoint record of claim uid " +
                                       uid);
    }
    // The record's leftover temporary files go too: a process killed while writing it leaves one.
    if (Status s = RemoveFileAndTemporaries(PathOf(uid)); !s.ok()) {
      return s.error().Wrap("cannot remove the prepare checkpoint record of claim uid " + uid);
    }
  }
  return dir_sync_->Sync();
}

Result<int> PrepareCheckpoint::Upgrade(std::string* problem) const {
  const std::string path = data_dir_ + "/" + kLegacyCheckpointFile;
  auto text = ReadFileToString(path, 64 << 20);
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kNotFound) return 0;
    return text.error().Wrap("cannot read the version-1 prepare checkpoint to upgrade it");
  }
  std::vector<ClaimRecord> records;
  try {
    const json root = json::parse(*text);
    const int version = root.at("version").get<int>();
    if (version != 1) {
      throw json::other_error::create(
          502, "version " + std::to_string(version) + " where version 1 was expected", nullptr);
    }
    const std::string boot_id = root.at("bootID").get<std::string>();
    for (const auto& [uid, entry] : root.at("claims").items()) {
      records.push_back(RecordFromVersion1(uid, boot_id, entry));
    }
  } catch (const json::exception& e) {
    if (problem != nullptr) {
      *problem = UnusableText(path, e.what(), MoveToUniqueAside(path),
                              "claims prepared before cannot be undone automatically, check their "
                              "devices by hand");
    }
    return 0;
  }
  for (const ClaimRecord& record : records) {
    if (!IsObjectUid(record.uid)) continue;
    // Written as is: the boot ID stays the one of the old file, so a reboot since is noticed.
    auto record_text = RecordText(record);
    if (!record_text.ok()) return record_text.error().Wrap("upgrading the prepare checkpoint");
    auto records_lock = LockRecords(LockMode::kShared);
    if (!records_lock.ok()) return records_lock.error().Wrap("upgrading the prepare checkpoint");
    Status status = WriteFileAtomically(PathOf(record.uid), *record_text, 0600);
    if (!status.ok()) return status.error().Wrap("upgrading the prepare checkpoint");
  }
  if (::unlink(path.c_str()) != 0) {
    return MakeError(ErrorKind::kUnavailable, "upgraded the prepare checkpoint " + path +
                                                  " but cannot remove it: " + ErrnoText(errno));
  }
  if (Status s = SyncDirectory(data_dir_); !s.ok()) return s.error();
  return static_cast<int>(records.size());
}

std::vector<PreparedTarget> PreparedTargets(const CheckpointView& view) {
  std::vector<PreparedTarget> out;
  for (const auto& [uid, shared] : view.claims) {
    const ClaimRecord& record = *shared;
    if (record.state != PrepareState::kPrepareCompleted) continue;
    for (const RecordedDevice& device : record.devices) {
      PreparedTarget target;
      target.claim = record.namespace_ + "/" + record.name;
      target.pool = device.pool;
      target.device = device.device;
      if (device.is_mdev) {
        target.mdev_uuid = device.mdev.uuid;
      } else if (device.is_vgpu) {
        target.vgpu_vf = device.address;
        target.vgpu_type = device.vgpu_type;
      } else {
        target.functions = device.functions;
        for (const FunctionRecord& f : record.functions) {
          target.vfio_drivers[f.address] = f.vfio_driver;
        }
      }
      out.push_back(std::move(target));
    }
  }
  return out;
}

std::map<std::string, discovery::ManagedFunction> ManagedFunctions(const CheckpointView& view) {
  std::map<std::string, discovery::ManagedFunction> out;
  for (const auto& [uid, record] : view.claims) {
    for (const FunctionRecord& f : record->functions) {
      out.emplace(f.address, discovery::ManagedFunction{f.driver, f.vfio_driver});
    }
  }
  return out;
}

Result<std::string> ReadBootId(const std::string& path) {
  auto text = ReadFileToString(path, 4096);
  if (!text.ok()) return text.error().Wrap("cannot read the boot ID");
  std::string id = *text;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace vfio_dra::prepare
