#include "kube/resource_claim.h"

namespace vfio_dra::kube {
namespace {

Error FieldError(const std::string& field, const std::string& problem) {
  return MakeError(ErrorKind::kInvalidArgument, "ResourceClaim field " + field + " " + problem);
}

// Reads an optional string member; missing or null gives "".
Result<std::string> StringField(const nlohmann::json& object, const char* key,
                                const std::string& path) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) return FieldError(path + "." + key, "must be a string");
  return it->get<std::string>();
}

Result<std::vector<std::string>> StringList(const nlohmann::json& object, const char* key,
                                            const std::string& path) {
  std::vector<std::string> out;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return out;
  if (!it->is_array()) return FieldError(path + "." + key, "must be a list");
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string()) {
      return FieldError(path + "." + key + "[" + std::to_string(i) + "]", "must be a string");
    }
    out.push_back((*it)[i].get<std::string>());
  }
  return out;
}

Result<AllocationResult> ParseAllocation(const nlohmann::json& allocation) {
  const std::string base = "status.allocation";
  if (!allocation.is_object()) return FieldError(base, "must be an object");
  AllocationResult out;
  auto devices_it = allocation.find("devices");
  if (devices_it == allocation.end() || devices_it->is_null()) return out;
  if (!devices_it->is_object()) return FieldError(base + ".devices", "must be an object");
  const nlohmann::json& devices = *devices_it;

  if (auto results = devices.find("results"); results != devices.end() && !results->is_null()) {
    if (!results->is_array()) return FieldError(base + ".devices.results", "must be a list");
    for (size_t i = 0; i < results->size(); ++i) {
      const std::string path = base + ".devices.results[" + std::to_string(i) + "]";
      const nlohmann::json& r = (*results)[i];
      if (!r.is_object()) return FieldError(path, "must be an object");
      DeviceRequestAllocationResult result;
      for (auto [key, target] :
           {std::pair{"request", &result.request}, std::pair{"driver", &result.driver},
            std::pair{"pool", &result.pool}, std::pair{"device", &result.device}}) {
        auto value = StringField(r, key, path);
        if (!value.ok()) return value.error();
        if (value->empty()) return FieldError(path + "." + key, "is required");
        *target = *value;
      }
      if (auto share = r.find("shareID"); share != r.end() && !share->is_null()) {
        if (!share->is_string()) return FieldError(path + ".shareID", "must be a string");
        result.share_id = share->get<std::string>();
      }
      if (auto admin = r.find("adminAccess"); admin != r.end() && !admin->is_null()) {
        if (!admin->is_boolean()) return FieldError(path + ".adminAccess", "must be a boolean");
        result.admin_access = admin->get<bool>();
      }
      out.results.push_back(std::move(result));
    }
  }
  if (auto config = devices.find("config"); config != devices.end() && !config->is_null()) {
    if (!config->is_array()) return FieldError(base + ".devices.config", "must be a list");
    for (size_t i = 0; i < config->size(); ++i) {
      const std::string path = base + ".devices.config[" + std::to_string(i) + "]";
      const nlohmann::json& c = (*config)[i];
      if (!c.is_object()) return FieldError(path, "must be an object");
      DeviceAllocationConfiguration entry;
      auto source = StringField(c, "source", path);
      if (!source.ok()) return source.error();
      entry.source = *source;
      auto requests = StringList(c, "requests", path);
      if (!requests.ok()) return requests.error();
      entry.requests = *requests;
      if (auto opaque = c.find("opaque"); opaque != c.end() && !opaque->is_null()) {
        if (!opaque->is_object()) return FieldError(path + ".opaque", "must be an object");
        OpaqueDeviceConfiguration parsed;
        auto driver = StringField(*opaque, "driver", path + ".opaque");
        if (!driver.ok()) return driver.error();
        parsed.driver = *driver;
        if (auto params = opaque->find("parameters"); params != opaque->end()) {
          parsed.parameters = *params;
        }
        entry.opaque = std::move(parsed);
      }
      out.config.push_back(std::move(entry));
    }
  }
  return out;
}

std::string StringOr(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

DeviceCondition ParseCondition(const nlohmann::json& condition) {
  DeviceCondition parsed;
  parsed.type = StringOr(condition, "type");
  parsed.status = StringOr(condition, "status");
  parsed.reason = StringOr(condition, "reason");
  parsed.message = StringOr(condition, "message");
  parsed.last_transition_time = StringOr(condition, "lastTransitionTime");
  if (auto it = condition.find("observedGeneration"); it != condition.end() && it->is_number()) {
    parsed.observed_generation = it->get<int64_t>();
  }
  return parsed;
}

std::optional<NetworkDeviceData> ParseNetworkData(const nlohmann::json& entry) {
  auto network = entry.find("networkData");
  if (network == entry.end() || !network->is_object()) return std::nullopt;
  NetworkDeviceData parsed;
  parsed.interface_name = StringOr(*network, "interfaceName");
  parsed.hardware_address = StringOr(*network, "hardwareAddress");
  if (auto ips = network->find("ips"); ips != network->end() && ips->is_array()) {
    for (const nlohmann::json& ip : *ips) {
      if (ip.is_string()) parsed.ips.push_back(ip.get<std::string>());
    }
  }
  return parsed;
}

// status.reservedFor: resource, name and uid identify the consumer, so each is required; apiGroup
// is empty for core resources (pods) and may be absent.
Result<std::vector<ResourceClaimConsumerReference>> ParseReservedFor(const nlohmann::json& list) {
  const std::string base = "status.reservedFor";
  if (!list.is_array()) return FieldError(base, "must be a list");
  std::vector<ResourceClaimConsumerReference> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = base + "[" + std::to_string(i) + "]";
    const nlohmann::json& entry = list[i];
    if (!entry.is_object()) return FieldError(path, "must be an object");
    ResourceClaimConsumerReference ref;
    auto api_group = StringField(entry, "apiGroup", path);
    if (!api_group.ok()) return api_group.error();
    ref.api_group = *api_group;
    for (auto [key, target] : {std::pair{"resource", &ref.resource}, std::pair{"name", &ref.name},
                               std::pair{"uid", &ref.uid}}) {
      auto value = StringField(entry, key, path);
      if (!value.ok()) return value.error();
      if (value->empty()) return FieldError(path + "." + key, "is required");
      *target = *value;
    }
    out.push_back(std::move(ref));
  }
  return out;
}

}  // namespace

std::vector<AllocatedDeviceStatus> ParseDeviceStatuses(const nlohmann::json& devices) {
  std::vector<AllocatedDeviceStatus> out;
  if (!devices.is_array()) return out;
  for (const nlohmann::json& entry : devices) {
    if (!entry.is_object()) continue;
    AllocatedDeviceStatus device;
    device.driver = StringOr(entry, "driver");
    device.pool = StringOr(entry, "pool");
    device.device = StringOr(entry, "device");
    if (auto share = entry.find("shareID"); share != entry.end() && share->is_string()) {
      device.share_id = share->get<std::string>();
    }
    if (device.driver.empty() || device.pool.empty() || device.device.empty()) continue;
    if (auto conditions = entry.find("conditions");
        conditions != entry.end() && conditions->is_array()) {
      for (const nlohmann::json& condition : *conditions) {
        if (!condition.is_object()) continue;
        DeviceCondition parsed = ParseCondition(condition);
        if (!parsed.type.empty()) device.conditions.push_back(std::move(parsed));
      }
    }
    if (auto data = entry.find("data"); data != entry.end() && data->is_object()) {
      device.data = *data;
    }
    device.network_data = ParseNetworkData(entry);
    out.push_back(std::move(device));
  }
  return out;
}

std::string BaseRequestName(const std::string& request) {
  return request.substr(0, request.find('/'));
}

Result<ResourceClaim> ParseResourceClaim(const nlohmann::json& object) {
  if (!object.is_object()) return FieldError("(object)", "must be a JSON object");
  ResourceClaim claim;
  auto api_version = StringField(object, "apiVersion", "");
  if (!api_version.ok()) return api_version.error();
  claim.api_version = *api_version;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) {
    return FieldError("metadata", "is missing or not an object");
  }
  for (auto [key, target] :
       {std::pair{"namespace", &claim.namespace_}, std::pair{"name", &claim.name},
        std::pair{"uid", &claim.uid}, std::pair{"resourceVersion", &claim.resource_version}}) {
    auto value = StringField(*metadata, key, "metadata");
    if (!value.ok()) return value.error();
    *target = *value;
  }
  if (auto generation = metadata->find("generation");
      generation != metadata->end() && !generation->is_null()) {
    if (!generation->is_number_integer()) {
      return FieldError("metadata.generation", "must be an integer");
    }
    claim.generation = generation->get<int64_t>();
  }
  if (auto annotations = metadata->find("annotations");
      annotations != metadata->end() && !annotations->is_null()) {
    if (!annotations->is_object()) return FieldError("metadata.annotations", "must be a map");
    for (const auto& [key, value] : annotations->items()) {
      if (!value.is_string()) {
        return FieldError("metadata.annotations[" + key + "]", "must be a string");
      }
      claim.annotations[key] = value.get<std::string>();
    }
  }
  auto status = object.find("status");
  if (status != object.end() && !status->is_null()) {
    if (!status->is_object()) return FieldError("status", "must be an object");
    auto allocation = status->find("allocation");
    if (allocation != status->end() && !allocation->is_null()) {
      auto parsed = ParseAllocation(*allocation);
      if (!parsed.ok()) return parsed.error();
      claim.allocation = std::move(*parsed);
    }
    auto reserved = status->find("reservedFor");
    if (reserved != status->end() && !reserved->is_null()) {
      auto parsed = ParseReservedFor(*reserved);
      if (!parsed.ok()) return parsed.error();
      claim.reserved_for = std::move(*parsed);
    }
    if (auto devices = status->find("devices"); devices != status->end()) {
      claim.device_statuses = ParseDeviceStatuses(*devices);
    }
  }
  return claim;
}

}  // namespace vfio_dra::kube
