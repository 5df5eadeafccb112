#include "kube/claim_status_writer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <ctime>
#include <set>
#include <tuple>

namespace vfio_dra::kube {
namespace {

// The API server's limits (resource.k8s.io/v1 AllocatedDeviceStatus, NetworkDeviceData and
// metav1.Condition).
constexpr size_t kMaxConditions = 8;
constexpr size_t kMaxDataBytes = size_t{10} * 1024;
constexpr size_t kMaxIps = 16;
constexpr size_t kMaxInterfaceName = 256;
constexpr size_t kMaxHardwareAddress = 128;
constexpr size_t kMaxReason = 1024;
constexpr size_t kMaxMessage = 32768;

constexpr const char* kDefaultApiVersion = "resource.k8s.io/v1";
constexpr const char* kGroupPrefix = "resource.k8s.io/";

std::string DeviceKey(const AllocatedDeviceStatus& device) {
  std::string key = device.driver + "/" + device.pool + "/" + device.device;
  if (device.share_id) key += "/" + *device.share_id;
  return key;
}

// metav1.Condition's reason: a CamelCase word, as the server's regex
// ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ demands.
bool IsConditionReason(const std::string& reason) {
  if (reason.empty() || reason.size() > kMaxReason) return false;
  if (std::isalpha(static_cast<unsigned char>(reason.front())) == 0) return false;
  const char last = reason.back();
  if (last == ',' || last == ':') return false;
  for (char c : reason) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_' && c != ',' && c != ':') {
      return false;
    }
  }
  return true;
}

Status ValidateCondition(const DeviceCondition& condition, const std::string& where) {
  const auto invalid = [&](const std::string& problem) {
    return MakeError(ErrorKind::kInvalidArgument, where + ": " + problem);
  };
  if (condition.type.empty()) return invalid("type is required");
  if (condition.status != "True" && condition.status != "False" && condition.status != "Unknown") {
    return invalid("status \"" + condition.status + "\" is not True, False or Unknown");
  }
  if (!IsConditionReason(condition.reason)) {
    return invalid("reason \"" + condition.reason +
                   "\" must be a CamelCase word of letters, digits, '_', ',' and ':'");
  }
  if (condition.message.size() > kMaxMessage) return invalid("message is longer than 32768 bytes");
  if (condition.observed_generation < 0) return invalid("observedGeneration is negative");
  return Status::Ok();
}

Status ValidateNetworkData(const NetworkDeviceData& network, const std::string& where) {
  const auto invalid = [&](const std::string& problem) {
    return MakeError(ErrorKind::kInvalidArgument, where + ".networkData." + problem);
  };
  if (network.interface_name.size() > kMaxInterfaceName) {
    return invalid("interfaceName is longer than 256 bytes");
  }
  if (network.hardware_address.size() > kMaxHardwareAddress) {
    return invalid("hardwareAddress is longer than 128 bytes");
  }
  if (network.ips.size() > kMaxIps) {
    return invalid("ips has " + std::to_string(network.ips.size()) + " entries, at most 16");
  }
  std::set<std::string> seen;
  for (const std::string& ip : network.ips) {
    if (!seen.insert(ip).second) return invalid("ips lists " + ip + " twice");
  }
  return Status::Ok();
}

Status ValidateDevice(const AllocatedDeviceStatus& device) {
  const std::string where = "status.devices entry " + DeviceKey(device);
  for (auto [name, value] : {std::pair{"driver", &device.driver}, std::pair{"pool", &device.pool},
                             std::pair{"device", &device.device}}) {
    if (value->empty()) {
      return MakeError(ErrorKind::kInvalidArgument, where + ": " + name + " is required");
    }
  }
  if (device.conditions.size() > kMaxConditions) {
    return MakeError(ErrorKind::kInvalidArgument,
                     where + ": " + std::to_string(device.conditions.size()) +
                         " conditions, the API server accepts at most 8");
  }
  std::set<std::string> types;
  for (const DeviceCondition& condition : device.conditions) {
    const std::string at = where + " condition " + condition.type;
    if (Status status = ValidateCondition(condition, at); !status.ok()) return status;
    if (!types.insert(condition.type).second) {
      return MakeError(ErrorKind::kInvalidArgument, at + ": type is listed twice");
    }
  }
  if (device.data) {
    if (!device.data->is_object()) {
      return MakeError(ErrorKind::kInvalidArgument, where + ": data must be a JSON object");
    }
    if (device.data->dump().size() > kMaxDataBytes) {
      return MakeError(ErrorKind::kInvalidArgument, where + ": data is larger than 10 KiB");
    }
  }
  if (device.network_data) return ValidateNetworkData(*device.network_data, where);
  return Status::Ok();
}

nlohmann::json ConditionJson(const DeviceCondition& condition, const std::string& now) {
  return {{"type", condition.type},
          {"status", condition.status},
          {"reason", condition.reason},
          {"message", condition.message},
          {"observedGeneration", condition.observed_generation},
          {"lastTransitionTime",
           condition.last_transition_time.empty() ? now : condition.last_transition_time}};
}

// Absent instead of empty: an applied empty value would still claim ownership of the field.
std::optional<nlohmann::json> NetworkDataJson(const NetworkDeviceData& network) {
  nlohmann::json out = nlohmann::json::object();
  if (!network.interface_name.empty()) out["interfaceName"] = network.interface_name;
  if (!network.ips.empty()) out["ips"] = network.ips;
  if (!network.hardware_address.empty()) out["hardwareAddress"] = network.hardware_address;
  if (out.empty()) return std::nullopt;
  return out;
}

nlohmann::json DeviceJson(const AllocatedDeviceStatus& device, const std::string& now) {
  nlohmann::json entry = {
      {"driver", device.driver}, {"pool", device.pool}, {"device", device.device}};
  if (device.share_id) entry["shareID"] = *device.share_id;
  if (!device.conditions.empty()) {
    nlohmann::json conditions = nlohmann::json::array();
    for (const DeviceCondition& condition : device.conditions) {
      conditions.push_back(ConditionJson(condition, now));
    }
    entry["conditions"] = std::move(conditions);
  }
  if (device.data) entry["data"] = *device.data;
  if (device.network_data) {
    if (auto network = NetworkDataJson(*device.network_data)) entry["networkData"] = *network;
  }
  return entry;
}

std::string ClaimName(const ClaimStatusTarget& claim) {
  return "ResourceClaim " + claim.namespace_ + "/" + claim.name;
}

std::string StringField(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// `driver`'s entries of a claim object's status.devices.
std::vector<AllocatedDeviceStatus> EntriesOf(const nlohmann::json& claim,
                                             const std::string& driver) {
  std::vector<AllocatedDeviceStatus> out;
  auto status = claim.find("status");
  if (status == claim.end() || !status->is_object()) return out;
  auto devices = status->find("devices");
  if (devices == status->end() || !devices->is_array()) return out;
  for (AllocatedDeviceStatus& entry : ParseDeviceStatuses(*devices)) {
    if (entry.driver == driver) out.push_back(std::move(entry));
  }
  return out;
}

std::vector<std::string> Canonical(const std::vector<AllocatedDeviceStatus>& devices) {
  std::vector<std::string> out;
  out.reserve(devices.size());
  for (const AllocatedDeviceStatus& device : devices) out.push_back(DeviceJson(device, "").dump());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool SameDeviceStatuses(const std::vector<AllocatedDeviceStatus>& shown,
                        const std::vector<AllocatedDeviceStatus>& want) {
  return Canonical(shown) == Canonical(want);
}

std::string FormatRfc3339(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buffer[32];
  const size_t length = std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return std::string(buffer, length);
}

nlohmann::json ClaimStatusApplyBody(const ClaimStatusTarget& claim,
                                    const std::vector<AllocatedDeviceStatus>& devices,
                                    std::chrono::system_clock::time_point now) {
  const std::string now_text = FormatRfc3339(now);
  nlohmann::json entries = nlohmann::json::array();
  for (const AllocatedDeviceStatus& device : devices) {
    entries.push_back(DeviceJson(device, now_text));
  }
  nlohmann::json metadata = {
      {"name", claim.name}, {"namespace", claim.namespace_}, {"uid", claim.uid}};
  // In an apply body, as in an update, a resourceVersion is a precondition.
  if (!claim.resource_version.empty()) metadata["resourceVersion"] = claim.resource_version;
  return {{"apiVersion", claim.api_version.empty() ? kDefaultApiVersion : claim.api_version},
          {"kind", "ResourceClaim"},
          {"metadata", std::move(metadata)},
          {"status", {{"devices", std::move(entries)}}}};
}

nlohmann::json ClaimStatusApplyBody(const ClaimStatusTarget& claim,
                                    const std::vector<AllocatedDeviceStatus>& devices) {
  return ClaimStatusApplyBody(claim, devices, std::chrono::system_clock::now());
}

Result<std::string> ClaimPath(const ClaimStatusTarget& claim) {
  const std::string api_version =
      claim.api_version.empty() ? kDefaultApiVersion : claim.api_version;
  const std::string prefix = kGroupPrefix;
  if (api_version.rfind(prefix, 0) != 0 || api_version.size() == prefix.size() ||
      api_version.find('/', prefix.size()) != std::string::npos) {
    return MakeError(ErrorKind::kInvalidArgument, ClaimName(claim) + " has apiVersion \"" +
                                                      api_version +
                                                      "\", not resource.k8s.io/<version>");
  }
  if (claim.namespace_.empty() || claim.name.empty()) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "a claim status write needs the claim's namespace and name (got \"" +
                         claim.namespace_ + "/" + claim.name + "\")");
  }
  return "/apis/" + api_version + "/namespaces/" + UrlEncode(claim.namespace_) +
         "/resourceclaims/" + UrlEncode(claim.name);
}

Result<std::string> ClaimStatusPath(const ClaimStatusTarget& claim) {
  auto path = ClaimPath(claim);
  if (!path.ok()) return path.error();
  return *path + "/status";
}

Status ValidateAllocatedDeviceStatuses(const std::vector<AllocatedDeviceStatus>& devices) {
  std::set<std::tuple<std::string, std::string, std::string, std::optional<std::string>>> keys;
  for (const AllocatedDeviceStatus& device : devices) {
    if (Status status = ValidateDevice(device); !status.ok()) return status;
    if (!keys.emplace(device.driver, device.pool, device.device, device.share_id).second) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "status.devices entry " + DeviceKey(device) + " is listed twice");
    }
  }
  return Status::Ok();
}

Status ApiClaimStatusWriter::Apply(const ClaimStatusTarget& claim,
                                   const std::vector<AllocatedDeviceStatus>& devices,
                                   Deadline deadline) {
  const std::string what = "cannot write status.devices of " + ClaimName(claim);
  if (auto path = ClaimStatusPath(claim); !path.ok()) return path.error().Wrap(what);
  if (claim.uid.empty()) {
    // Without the uid precondition the write could land on a claim re-created under the name.
    return MakeError(ErrorKind::kInvalidArgument, what + ": the claim's uid is unknown");
  }
  for (const AllocatedDeviceStatus& device : devices) {
    if (device.driver != driver_) {
      return MakeError(ErrorKind::kInvalidArgument,
                       what + ": entry " + DeviceKey(device) + " is not of driver " + driver_ +
                           ", whose entries alone this writer applies");
    }
  }
  if (Status valid = ValidateAllocatedDeviceStatuses(devices); !valid.ok()) {
    return valid.error().Wrap(what);
  }
  auto served = InServedVersion(claim, deadline);
  if (!served.ok()) return served.error().Wrap(what);
  auto path = ClaimStatusPath(*served);
  if (!path.ok()) return path.error().Wrap(what);
  const nlohmann::json body = ClaimStatusApplyBody(*served, devices);
  // force: we own our driver's entries; another manager's stale copy of one must not block us.
  const std::string target = *path + "?fieldManager=" + UrlEncode(driver_) + "&force=true";
  auto response = client_.Call("PATCH", target, &body, deadline, kApplyPatchContentType);
  if (!response.ok()) return response.error().Wrap(what);
  return ApplyResponseStatus(*served, *path, *response);
}

Status ApiClaimStatusWriter::ApplyResponseStatus(const ClaimStatusTarget& claim,
                                                 const std::string& path,
                                                 const ApiResponse& response) const {
  const std::string what = "cannot write status.devices of " + ClaimName(claim);
  if (response.status == 200 || response.status == 201) return Status::Ok();
  const ApiStatus status = ParseApiStatus(response);
  if (response.status == 404 && status.reason == "NotFound") {
    return MakeError(ErrorKind::kNotFound,
                     what + ": the claim no longer exists (" + status.message + ")");
  }
  if (response.status == 404) {
    // A bare 404 page: the API version the claim was read in is no longer served.
    return MakeError(
        ErrorKind::kFailedPrecondition,
        what + ": the API server does not serve " + path + " (HTTP 404: " + status.message + ")");
  }
  if (response.status == 409 && !claim.resource_version.empty()) {
    // The uid or the resourceVersion precondition failed: a new reading tells which.
    return MakeError(ErrorKind::kConflict, what + ": the claim changed since resourceVersion " +
                                               claim.resource_version + " (" + status.message +
                                               "); read it again and decide again");
  }
  if (response.status == 409) {
    return MakeError(ErrorKind::kNotFound, what +
                                               ": the claim was replaced (its uid is no longer " +
                                               claim.uid + "): " + status.message);
  }
  Error error = ApiErrorFromResponse("PATCH", path, response).Wrap(what);
  AddRbacHint(error, response,
              "patch on resourceclaims/status and, from Kubernetes 1.36, "
              "associated-node:patch on resourceclaims/driver for " +
                  driver_);
  return error;
}

Result<ClaimStatusTarget> ApiClaimStatusWriter::InServedVersion(const ClaimStatusTarget& claim,
                                                                Deadline deadline) {
  ClaimStatusTarget target = claim;
  if (target.api_version.empty()) target.api_version = kDefaultApiVersion;
  const std::string prefix = kGroupPrefix;
  // v1 needs no look at discovery; a malformed version is left for ClaimPath to refuse.
  if (target.api_version == kDefaultApiVersion || target.api_version.rfind(prefix, 0) != 0) {
    return target;
  }
  auto served = versions_.Served(deadline);
  if (!served.ok()) return served.error();
  const std::string own = target.api_version.substr(prefix.size());
  if (!served->empty() && std::find(served->begin(), served->end(), own) == served->end()) {
    target.api_version = prefix + served->front();
  }
  return target;
}

std::optional<Result<ClaimStatusReading>> ApiClaimStatusWriter::ReadIn(
    const ClaimStatusTarget& claim, Deadline deadline) {
  const std::string what = "cannot read " + ClaimName(claim) + " for its status.devices";
  auto path = ClaimPath(claim);
  if (!path.ok()) return path.error().Wrap(what);
  auto response = client_.Call("GET", *path, nullptr, deadline);
  if (!response.ok()) return response.error().Wrap(what);
  if (response->status == 404 && ParseApiStatus(*response).reason != "NotFound") {
    return std::nullopt;  // a bare 404 page: this version is not served
  }
  if (response->status == 404) {
    return MakeError(ErrorKind::kNotFound, what + ": the claim no longer exists");
  }
  if (response->status != 200 || !response->body.is_object()) {
    return ApiErrorFromResponse("GET", *path, *response).Wrap(what);
  }
  const nlohmann::json meta = response->body.value("metadata", nlohmann::json::object());
  const std::string uid = meta.is_object() ? StringField(meta, "uid") : std::string();
  if (uid != claim.uid) {
    return MakeError(ErrorKind::kNotFound, what + ": the claim was replaced (its uid is " + uid +
                                               ", not " + claim.uid + ")");
  }
  return ClaimStatusReading{claim.api_version, StringField(meta, "resourceVersion"),
                            EntriesOf(response->body, driver_)};
}

Result<ClaimStatusReading> ApiClaimStatusWriter::Read(const ClaimStatusTarget& claim,
                                                      Deadline deadline) {
  const std::string what = "cannot read " + ClaimName(claim) + " for its status.devices";
  auto first = InServedVersion(claim, deadline);
  if (!first.ok()) return first.error().Wrap(what);
  std::vector<std::string> versions = {first->api_version};
  std::vector<std::string> unserved;
  for (size_t i = 0; i < versions.size(); ++i) {
    ClaimStatusTarget in_version = *first;
    in_version.api_version = versions[i];
    auto reading = ReadIn(in_version, deadline);
    if (reading) return std::move(*reading);
    unserved.push_back(versions[i]);
    if (i > 0) continue;
    // The server no longer serves what we took it to: ask it again, once.
    versions_.Forget();
    auto served = versions_.Served(deadline);
    if (!served.ok()) return served.error().Wrap(what);
    for (const std::string& version : *served) {
      const std::string full = kGroupPrefix + version;
      if (full != versions[0]) versions.push_back(full);
    }
  }
  std::string tried;
  for (const std::string& version : unserved) tried += (tried.empty() ? "" : ", ") + version;
  return MakeError(ErrorKind::kFailedPrecondition,
                   what + ": the API server serves none of " + tried +
                       " (HTTP 404 for each); its entries stay until a version is served");
}

}  // namespace vfio_dra::kube
