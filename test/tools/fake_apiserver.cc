#include "fake_apiserver.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <regex>
#include <set>
#include <sstream>

namespace vfio_dra::testing {
namespace {

using nlohmann::json;

json StatusBody(int code, const std::string& reason, const std::string& message,
                const std::string& kind = "", const std::string& name = "",
                const std::string& group = "resource.k8s.io") {
  json status = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
                 {"status", "Failure"}, {"message", message}, {"reason", reason},
                 {"code", code}};
  if (!kind.empty() || !name.empty()) {
    status["details"] = {{"name", name}, {"kind", kind}};
    // The core group is "", which the server leaves out.
    if (!group.empty()) status["details"]["group"] = group;
  }
  return status;
}

void Reply(httplib::Response& res, int code, const json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void ReplyStatus(httplib::Response& res, int code, const std::string& reason,
                 const std::string& message, const std::string& kind = "",
                 const std::string& name = "", const std::string& group = "resource.k8s.io") {
  Reply(res, code, StatusBody(code, reason, message, kind, name, group));
}

// What the real server answers for a verb a resource does not support.
void ReplyMethodNotAllowed(httplib::Response& res) {
  ReplyStatus(res, 405, "MethodNotAllowed",
              "the server does not allow this method on the requested resource");
}

void ReplyPageNotFound(httplib::Response& res) {
  // What the real server answers for a path no API group version serves.
  res.status = 404;
  res.set_content("404 page not found\n", "text/plain; charset=utf-8");
}

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '/')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

struct FieldRequirement {
  std::string key;
  std::string value;
  bool negate = false;
};

// Parses "a=b,c!=d"; returns false on a malformed or unsupported selector.
bool ParseFieldSelector(const std::string& text, std::vector<FieldRequirement>& out,
                        std::string& error) {
  std::istringstream in(text);
  std::string term;
  while (std::getline(in, term, ',')) {
    if (term.empty()) continue;
    FieldRequirement req;
    size_t pos;
    if ((pos = term.find("!=")) != std::string::npos) {
      req.key = term.substr(0, pos);
      req.value = term.substr(pos + 2);
      req.negate = true;
    } else if ((pos = term.find("==")) != std::string::npos) {
      req.key = term.substr(0, pos);
      req.value = term.substr(pos + 2);
    } else if ((pos = term.find('=')) != std::string::npos) {
      req.key = term.substr(0, pos);
      req.value = term.substr(pos + 1);
    } else {
      error = "invalid field selector: " + term;
      return false;
    }
    if (req.key != "spec.nodeName" && req.key != "spec.driver" && req.key != "metadata.name") {
      error = "field label not supported: " + req.key;
      return false;
    }
    out.push_back(req);
  }
  return true;
}

std::string FieldValue(const json& object, const std::string& key) {
  if (key == "metadata.name") return object["metadata"].value("name", "");
  const json& spec = object.contains("spec") ? object["spec"] : json::object();
  if (key == "spec.nodeName") return spec.value("nodeName", "");
  if (key == "spec.driver") return spec.value("driver", "");
  return "";
}

bool Matches(const json& object, const std::vector<FieldRequirement>& selector) {
  for (const auto& req : selector) {
    if ((FieldValue(object, req.key) == req.value) == req.negate) return false;
  }
  return true;
}

// v1beta1 wraps every device field but the name in "basic"; the store keeps v1.
json SliceToVersion(json slice, const std::string& version) {
  slice["apiVersion"] = "resource.k8s.io/" + version;
  if (version != "v1beta1" || !slice.contains("spec") || !slice["spec"].contains("devices")) {
    return slice;
  }
  for (json& device : slice["spec"]["devices"]) {
    json basic = json::object();
    for (auto it = device.begin(); it != device.end();) {
      if (it.key() != "name") {
        basic[it.key()] = it.value();
        it = device.erase(it);
      } else {
        ++it;
      }
    }
    device["basic"] = basic;
  }
  return slice;
}

json SliceFromVersion(json slice, const std::string& version) {
  slice["apiVersion"] = "resource.k8s.io/v1";
  if (version != "v1beta1" || !slice.contains("spec") || !slice["spec"].contains("devices")) {
    return slice;
  }
  for (json& device : slice["spec"]["devices"]) {
    if (!device.contains("basic")) continue;
    json basic = device["basic"];
    device.erase("basic");
    for (auto& [key, value] : basic.items()) device[key] = value;
  }
  return slice;
}

bool IsLabel(const std::string& v) {
  if (v.empty() || v.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(v.front()) || !alnum(v.back())) return false;
  for (char c : v) {
    if (!alnum(c) && c != '-') return false;
  }
  return true;
}

// The server's ResourceSlice validation for release 1.<minor>, written independently of the
// plugin's own validator so that tests check one against the other. Returns "" or the causes.
std::string ValidateSlice(const json& slice, int minor, std::string& field) {
  const json& spec = slice.contains("spec") ? slice["spec"] : json::object();
  auto fail = [&](const std::string& f, const std::string& message) {
    field = f;
    return message;
  };
  if (!spec.contains("driver") || !spec["driver"].is_string() ||
      spec["driver"].get<std::string>().empty()) {
    return fail("spec.driver", "Required value");
  }
  if (spec["driver"].get<std::string>().size() > 63) {
    return fail("spec.driver", "Too long: may not be more than 63 bytes");
  }
  const json& pool = spec.contains("pool") ? spec["pool"] : json::object();
  if (!pool.contains("name") || pool["name"].get<std::string>().empty()) {
    return fail("spec.pool.name", "Required value");
  }
  if (!pool.contains("resourceSliceCount") || pool["resourceSliceCount"].get<int64_t>() <= 0) {
    return fail("spec.pool.resourceSliceCount", "Invalid value: must be greater than zero");
  }
  if (!pool.contains("generation") || pool["generation"].get<int64_t>() < 0) {
    return fail("spec.pool.generation", "Invalid value: must be greater than or equal to 0");
  }
  if (!spec.contains("nodeName") || spec["nodeName"].get<std::string>().empty()) {
    return fail("spec",
                "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required");
  }
  const bool has_devices = spec.contains("devices") && !spec["devices"].is_null();
  const bool has_counters = spec.contains("sharedCounters") && !spec["sharedCounters"].is_null();
  if (minor >= 35 && has_devices && has_counters) {
    return fail("spec",
                "Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed");
  }
  size_t counters_total = 0;
  if (has_counters) {
    if (minor >= 35 && spec["sharedCounters"].size() > 8) {
      return fail("spec.sharedCounters",
                  "Too many: " + std::to_string(spec["sharedCounters"].size()) +
                      ": must have at most 8 items");
    }
    for (const json& set : spec["sharedCounters"]) {
      if (!IsLabel(set.value("name", ""))) {
        return fail("spec.sharedCounters[].name", "Invalid value: a lowercase RFC 1123 label");
      }
      counters_total += set.contains("counters") ? set["counters"].size() : 0;
    }
    if (minor < 35 && counters_total > 32) {
      return fail("spec.sharedCounters",
                  "Invalid value: the total number of shared counters must not exceed 32");
    }
  }
  if (has_devices) {
    bool consumes = false;
    std::set<std::string> names;
    for (const json& device : spec["devices"]) {
      const std::string name = device.value("name", "");
      if (!IsLabel(name)) {
        return fail("spec.devices[].name",
                    "Invalid value: \"" + name + "\": a lowercase RFC 1123 label");
      }
      if (!names.insert(name).second) {
        return fail("spec.devices[].name", "Duplicate value: \"" + name + "\"");
      }
      const std::string version = slice.value("apiVersion", "");
      const json* fields = &device;
      if (version == "resource.k8s.io/v1beta1") {
        if (!device.contains("basic")) return fail("spec.devices[].basic", "Required value");
        fields = &device["basic"];
      }
      const json attributes = fields->value("attributes", json::object());
      if (attributes.size() > 32) {
        return fail("spec.devices[].attributes",
                    "Too many: must have at most 32 attributes and capacities combined");
      }
      for (const auto& [key, value] : attributes.items()) {
        if (value.size() != 1) {
          return fail("spec.devices[].attributes[" + key + "]",
                      "Invalid value: exactly one value must be specified");
        }
        if (value.contains("string") && value["string"].get<std::string>().size() > 64) {
          return fail("spec.devices[].attributes[" + key + "].string",
                      "Too long: may not be more than 64 bytes");
        }
      }
      if (fields->contains("consumesCounters")) {
        consumes = true;
        if (minor >= 35 && (*fields)["consumesCounters"].size() > 2) {
          return fail("spec.devices[].consumesCounters", "Too many: must have at most 2 items");
        }
      }
    }
    const size_t limit = (minor >= 35 && consumes) ? 64 : 128;
    if (spec["devices"].size() > limit) {
      return fail("spec.devices", "Too many: " + std::to_string(spec["devices"].size()) +
                                      ": must have at most " + std::to_string(limit) + " items");
    }
  }
  return "";
}

// What the server does with the partitionable-devices gate off.
void DropPartitionableFields(json& slice) {
  if (!slice.contains("spec")) return;
  json& spec = slice["spec"];
  spec.erase("sharedCounters");
  if (spec.contains("devices")) {
    for (json& device : spec["devices"]) {
      device.erase("consumesCounters");
      if (device.contains("basic")) device["basic"].erase("consumesCounters");
    }
  }
}

std::string RandomSuffix() {
  static thread_local std::mt19937 rng(std::random_device{}());
  const char* alphabet = "bcdfghjklmnpqrstvwxz2456789";
  std::string out;
  for (int i = 0; i < 5; ++i) out += alphabet[rng() % 27];
  return out;
}

// ---- Server-side apply of a claim's status.devices ----

constexpr const char* kApplyPatchType = "application/apply-patch+yaml";

// A string member, or "" when it is absent or not a string (bodies are client input).
std::string StringOr(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The list-map key of a status.devices entry (types already checked).
json DeviceKeyFields(const json& entry) {
  json key = {{"driver", entry["driver"]}, {"pool", entry["pool"]}, {"device", entry["device"]}};
  if (entry.contains("shareID") && !entry["shareID"].is_null()) key["shareID"] = entry["shareID"];
  return key;
}

// As managedFields spells it: k:{"device":...,"driver":...,"pool":...} (sorted keys).
std::string DeviceKey(const json& entry) { return "k:" + DeviceKeyFields(entry).dump(); }

// "driver/pool/device[/shareID]", as the server's allocated-device check prints it.
std::string SharedDeviceId(const json& entry) {
  std::string id = entry["driver"].get<std::string>() + "/" + entry["pool"].get<std::string>() +
                   "/" + entry["device"].get<std::string>();
  if (entry.contains("shareID") && entry["shareID"].is_string()) {
    id += "/" + entry["shareID"].get<std::string>();
  }
  return id;
}

std::string ExpectType(const json& parent, const char* key, const std::string& path,
                       json::value_t type, const char* type_name) {
  if (!parent.contains(key) || parent[key].is_null()) return "";
  const json& value = parent[key];
  const bool ok =
      type == json::value_t::number_integer ? value.is_number_integer() : value.type() == type;
  return ok ? "" : path + "." + key + ": expected " + type_name;
}

// Checks JSON types as decoding into the typed object does; "" or "<field>: expected <type>".
std::string CheckConditionTypes(const json& condition, const std::string& path) {
  if (!condition.is_object()) return path + ": expected map";
  for (const char* key : {"type", "status", "reason", "message", "lastTransitionTime"}) {
    std::string error = ExpectType(condition, key, path, json::value_t::string, "string");
    if (!error.empty()) return error;
  }
  return ExpectType(condition, "observedGeneration", path, json::value_t::number_integer,
                    "integer");
}

std::string CheckEntryTypes(const json& entry, const std::string& path) {
  if (!entry.is_object()) return path + ": expected map";
  for (const char* key : {"driver", "pool", "device", "shareID"}) {
    std::string error = ExpectType(entry, key, path, json::value_t::string, "string");
    if (!error.empty()) return error;
  }
  std::string error = ExpectType(entry, "conditions", path, json::value_t::array, "list");
  if (!error.empty()) return error;
  if (entry.contains("conditions") && entry["conditions"].is_array()) {
    for (size_t i = 0; i < entry["conditions"].size(); ++i) {
      error = CheckConditionTypes(entry["conditions"][i],
                                  path + ".conditions[" + std::to_string(i) + "]");
      if (!error.empty()) return error;
    }
  }
  error = ExpectType(entry, "networkData", path, json::value_t::object, "map");
  if (!error.empty() || !entry.contains("networkData") || entry["networkData"].is_null()) {
    return error;
  }
  const json& network = entry["networkData"];
  const std::string network_path = path + ".networkData";
  for (const char* key : {"interfaceName", "hardwareAddress"}) {
    error = ExpectType(network, key, network_path, json::value_t::string, "string");
    if (!error.empty()) return error;
  }
  error = ExpectType(network, "ips", network_path, json::value_t::array, "list");
  if (!error.empty() || !network.contains("ips") || network["ips"].is_null()) return error;
  for (const json& ip : network["ips"]) {
    if (!ip.is_string()) return network_path + ".ips: expected list of strings";
  }
  return "";
}

// The driver/pool/device[/shareID] of every allocated device of a stored claim.
std::set<std::string> AllocatedDevices(const json& claim) {
  std::set<std::string> out;
  const json* results = &claim;
  for (const char* key : {"status", "allocation", "devices", "results"}) {
    if (!results->is_object() || !results->contains(key)) return out;
    results = &(*results)[key];
  }
  if (!results->is_array()) return out;
  for (const json& result : *results) {
    if (result.is_object() && result.contains("driver") && result.contains("pool") &&
        result.contains("device")) {
      out.insert(SharedDeviceId(result));
    }
  }
  return out;
}

std::string ValidateCondition(const json& condition, const std::string& path, std::string& field) {
  static const std::regex kReason("^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$");
  auto fail = [&](const std::string& f, const std::string& message) {
    field = path + "." + f;
    return message;
  };
  if (condition.value("type", "").empty()) return fail("type", "Required value");
  const std::string status = condition.value("status", "");
  if (status != "True" && status != "False" && status != "Unknown") {
    return fail("status", "Unsupported value: \"" + status +
                              "\": supported values: \"False\", \"True\", \"Unknown\"");
  }
  const std::string reason = condition.value("reason", "");
  if (reason.empty()) return fail("reason", "Required value");
  if (reason.size() > 1024 || !std::regex_match(reason, kReason)) {
    return fail("reason", "Invalid value: \"" + reason +
                              "\": a condition reason must start with alphabetic character, "
                              "optionally followed by a string of alphanumeric characters or "
                              "'_,:', and must end with an alphanumeric character or '_'");
  }
  if (condition.value("message", "").size() > 32768) {
    return fail("message", "Too long: may not be more than 32768 bytes");
  }
  if (condition.value("lastTransitionTime", "").empty()) {
    return fail("lastTransitionTime", "Required value: must be set");
  }
  if (condition.value("observedGeneration", int64_t{0}) < 0) {
    return fail("observedGeneration", "Invalid value: must be greater than or equal to zero");
  }
  return "";
}

std::string ValidateNetworkData(const json& network, const std::string& path, std::string& field) {
  auto fail = [&](const std::string& f, const std::string& message) {
    field = path + "." + f;
    return message;
  };
  if (network.value("interfaceName", "").size() > 256) {
    return fail("interfaceName", "Too long: may not be more than 256 bytes");
  }
  if (network.value("hardwareAddress", "").size() > 128) {
    return fail("hardwareAddress", "Too long: may not be more than 128 bytes");
  }
  const json ips = network.value("ips", json::array());
  if (ips.size() > 16) {
    return fail("ips", "Too many: " + std::to_string(ips.size()) + ": must have at most 16 items");
  }
  std::set<std::string> seen;
  for (const json& ip : ips) {
    const std::string text = ip.get<std::string>();
    if (text.find('/') == std::string::npos) {
      return fail("ips", "Invalid value: \"" + text + "\": must be a valid address in CIDR form");
    }
    if (!seen.insert(text).second) return fail("ips", "Duplicate value: \"" + text + "\"");
  }
  return "";
}

// The server's validation of one applied status.devices entry (types already checked); "" or the
// problem, with `field` set.
std::string ValidateDeviceEntry(const json& entry, const std::string& path,
                                const std::set<std::string>& allocated, std::string& field) {
  for (const char* key : {"driver", "pool", "device"}) {
    if (entry.value(key, "").empty()) {
      field = path + "." + key;
      return "Required value";
    }
  }
  if (!allocated.count(SharedDeviceId(entry))) {
    field = path;
    return "Invalid value: \"" + SharedDeviceId(entry) +
           "\": must be an allocated device in the claim";
  }
  const json conditions = entry.value("conditions", json::array());
  if (conditions.size() > 8) {
    field = path + ".conditions";
    return "Too many: " + std::to_string(conditions.size()) + ": must have at most 8 items";
  }
  for (size_t i = 0; i < conditions.size(); ++i) {
    std::string problem =
        ValidateCondition(conditions[i], path + ".conditions[" + std::to_string(i) + "]", field);
    if (!problem.empty()) return problem;
  }
  if (entry.contains("data") && !entry["data"].is_null()) {
    field = path + ".data";
    if (!entry["data"].is_object()) return "Invalid value: must be a valid JSON object";
    if (entry["data"].dump().size() > size_t{10} * 1024) {
      return "Too long: may not be more than 10240 bytes";
    }
  }
  if (entry.contains("networkData") && entry["networkData"].is_object()) {
    return ValidateNetworkData(entry["networkData"], path + ".networkData", field);
  }
  return "";
}

void ReplyInvalidClaim(httplib::Response& res, const std::string& name, const std::string& field,
                       const std::string& problem) {
  json status = StatusBody(
      422, "Invalid",
      "ResourceClaim.resource.k8s.io \"" + name + "\" is invalid: " + field + ": " + problem,
      "ResourceClaim", name);
  status["details"]["causes"] =
      json::array({{{"reason", "FieldValueInvalid"}, {"message", problem}, {"field", field}}});
  Reply(res, 422, status);
}

// The applied status.devices list, or a 400 answer (false) when the body cannot be decoded.
bool DecodeAppliedDevices(const json& body, httplib::Response& res, json& devices) {
  devices = json::array();
  std::string error = ExpectType(body, "status", "", json::value_t::object, "map");
  if (error.empty() && body.contains("status") && body["status"].is_object()) {
    error = ExpectType(body["status"], "devices", ".status", json::value_t::array, "list");
    if (error.empty() && body["status"].contains("devices") &&
        body["status"]["devices"].is_array()) {
      devices = body["status"]["devices"];
      for (size_t i = 0; i < devices.size() && error.empty(); ++i) {
        error = CheckEntryTypes(devices[i], ".status.devices[" + std::to_string(i) + "]");
      }
    }
  }
  if (error.empty()) return true;
  ReplyStatus(res, 400, "BadRequest", "failed to create typed patch object: " + error);
  return false;
}

// Checks what the server checks of an apply request before it looks at the object: the patch type
// and PatchOptions. Answers and returns false when the request is refused.
bool AcceptApplyRequest(const httplib::Request& req, httplib::Response& res) {
  const std::string content_type = req.get_header_value("Content-Type");
  if (content_type.rfind(kApplyPatchType, 0) != 0) {
    if (req.has_param("force")) {
      ReplyStatus(res, 422, "Invalid",
                  "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be "
                  "specified for non-apply patch",
                  "PatchOptions", "", "meta.k8s.io");
      return false;
    }
    ReplyStatus(res, 415, "UnsupportedMediaType",
                "the fake API server implements only " + std::string(kApplyPatchType) +
                    " patches of resourceclaims/status, not " + content_type);
    return false;
  }
  const std::string manager = req.get_param_value("fieldManager");
  if (manager.empty() || manager.size() > 128) {
    ReplyStatus(res, 422, "Invalid",
                std::string("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: ") +
                    (manager.empty() ? "Required value: is required for apply patch"
                                     : "Too long: may not be more than 128 bytes"),
                "PatchOptions", "", "meta.k8s.io");
    return false;
  }
  return true;
}

// The apply body's type and identity against the URL's; answers and returns false on a mismatch.
bool AcceptApplyBody(const json& body, const std::string& version, const std::string& namespace_,
                     const std::string& name, httplib::Response& res) {
  if (!body.is_object()) {
    ReplyStatus(res, 400, "BadRequest", "error decoding YAML: the body is not a JSON object");
    return false;
  }
  const std::string expected = "resource.k8s.io/" + version;
  const std::string api_version = StringOr(body, "apiVersion");
  if (api_version != expected || StringOr(body, "kind") != "ResourceClaim") {
    ReplyStatus(res, 400, "BadRequest",
                "the API version in the data (" + api_version +
                    ") does not match the expected API version (" + expected +
                    "), or its kind is not ResourceClaim");
    return false;
  }
  const json meta = body.contains("metadata") ? body["metadata"] : json::object();
  if (!meta.is_object() || StringOr(meta, "name") != name) {
    ReplyStatus(res, 400, "BadRequest",
                "the name of the object does not match the name on the URL (" + name + ")");
    return false;
  }
  if (meta.contains("namespace") && StringOr(meta, "namespace") != namespace_) {
    ReplyStatus(res, 400, "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the "
                "request");
    return false;
  }
  return true;
}

// Without force, an apply may not change an entry another manager owns: the first such entry as
// the server reports it, or "".
std::string ApplyConflict(const json& claim,
                          const std::map<std::string, std::set<std::string>>& owners,
                          const std::string& manager, const json& applied) {
  const json* stored = &claim;
  for (const char* key : {"status", "devices"}) {
    if (!stored->is_object() || !stored->contains(key)) return "";
    stored = &(*stored)[key];
  }
  for (const json& entry : applied) {
    const std::string key = DeviceKey(entry);
    auto existing = std::find_if(stored->begin(), stored->end(),
                                 [&](const json& d) { return DeviceKey(d) == key; });
    if (existing == stored->end() || *existing == entry) continue;
    for (const auto& [other, keys] : owners) {
      if (other != manager && keys.count(key)) {
        return "conflict with \"" + other + "\": .status.devices[" + key + "]";
      }
    }
  }
  return "";
}

// managedFields as the server reports them for status applies.
json ManagedFields(const std::map<std::string, std::set<std::string>>& owners) {
  json out = json::array();
  for (const auto& [manager, keys] : owners) {
    json devices = json::object();
    for (const std::string& key : keys) devices[key] = json::object();
    out.push_back({{"manager", manager},
                   {"operation", "Apply"},
                   {"apiVersion", "resource.k8s.io/v1"},
                   {"fieldsType", "FieldsV1"},
                   {"fieldsV1", {{"f:status", {{"f:devices", devices}}}}},
                   {"subresource", "status"}});
  }
  return out;
}

}  // namespace

FakeApiServer::FakeApiServer(FakeApiServerOptions options) : options_(std::move(options)) {}

FakeApiServer::~FakeApiServer() { Stop(); }

long long FakeApiServer::NextRv() { return ++rv_; }

void FakeApiServer::Emit(const std::string& type, const json& object) {
  slice_events_.push_back(
      Event{std::stoll(object["metadata"]["resourceVersion"].get<std::string>()), type, object});
  ++slice_events_made_;
  while (slice_events_.size() > 1000) slice_events_.pop_front();
  changed_.notify_all();
}

bool FakeApiServer::Start(int port) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  rbac_.reset();
  if (!options_.rbac_file.empty()) {
    // Read at every start, so that a restarted server picks up an edited file.
    auto rbac = RbacAuthorizer::Load(options_.rbac_file, options_.rbac_user);
    if (!rbac.ok()) {
      std::cerr << "fake-apiserver: " << rbac.error().message << "\n";
      return false;
    }
    rbac_ = std::make_unique<const RbacAuthorizer>(std::move(*rbac));
  }
  if (!options_.tls_cert_file.empty()) {
    // With a client CA the server, like a real API server configured for client certificates,
    // refuses the handshake of a client without one signed by it.
    server_ = std::make_unique<httplib::SSLServer>(
        options_.tls_cert_file.c_str(), options_.tls_key_file.c_str(),
        options_.tls_client_ca_file.empty() ? nullptr : options_.tls_client_ca_file.c_str());
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  server_->new_task_queue = [threads = static_cast<size_t>(std::max(1, options_.threads))] {
    return new httplib::ThreadPool(threads);
  };
  // A real API server serves any number of requests on a kept-alive connection; cpp-httplib's
  // default closes it after five, which made clients reconnect (a TLS handshake each time) for
  // one request in five.
  server_->set_keep_alive_max_count(std::numeric_limits<size_t>::max());
  // A real API server answers without Nagle delays; without this, small responses wait for the
  // client's delayed ACK (about 40 ms) and every measured call would include it.
  server_->set_tcp_nodelay(true);
  listen_fd_ = -1;
  server_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    if (listen_fd_ < 0) listen_fd_ = sock;
  });
  InstallRoutes();
  if (port == 0) {
    port_ = server_->bind_to_any_port("127.0.0.1");
    if (port_ <= 0) return false;
  } else {
    if (!server_->bind_to_port("127.0.0.1", port)) return false;
    port_ = port;
  }
  // The packaged cpp-httplib listens with a backlog of 5, so a burst of new connections (32
  // pods' claim reads) loses SYNs and waits a second for the retransmit; no API server does
  // that. Listening again on the bound socket raises the backlog.
  if (listen_fd_ >= 0) ::listen(listen_fd_, 512);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // The socket already listens (connections queue in its backlog); wait only until the accept
  // loop runs, so that Stop() cannot race with its start.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  return server_->is_running();
}

void FakeApiServer::Stop() {
  if (!server_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

std::string FakeApiServer::WriteKubeconfig(const std::string& dir,
                                           const std::string& token_file) const {
  std::string path = dir + "/kubeconfig";
  std::ofstream out(path);
  out << "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
      << "clusters:\n- name: fake\n  cluster:\n    server: " << url() << "\n";
  // A TLS server's certificate is self-signed: it is its own CA.
  if (!options_.tls_cert_file.empty()) {
    out << "    certificate-authority: " << options_.tls_cert_file << "\n";
  }
  out << "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
      << "users:\n- name: fake\n  user:\n";
  if (!token_file.empty()) {
    out << "    tokenFile: " << token_file << "\n";
  } else if (!options_.token.empty()) {
    out << "    token: " << options_.token << "\n";
  } else {
    out << "    {}\n";
  }
  return path;
}

void FakeApiServer::SetFaultMix(const FaultMix& mix) {
  std::lock_guard<std::mutex> lock(mu_);
  mix_ = mix;
  random_.seed(mix.seed);
}

InjectedFaults FakeApiServer::Injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

void FakeApiServer::SetToken(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.token = token;
}

json FakeApiServer::PutClaim(json claim) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& meta = claim["metadata"];
  if (!meta.contains("uid")) meta["uid"] = "claim-uid-" + std::to_string(next_uid_++);
  meta["resourceVersion"] = std::to_string(NextRv());
  claim["apiVersion"] = "resource.k8s.io/v1";
  claim["kind"] = "ResourceClaim";
  const std::string key =
      meta["namespace"].get<std::string>() + "/" + meta["name"].get<std::string>();
  claims_[key] = claim;
  device_owners_.erase(key);
  return claim;
}

void FakeApiServer::RemoveClaim(const std::string& namespace_, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  claims_.erase(namespace_ + "/" + name);
  device_owners_.erase(namespace_ + "/" + name);
}

json FakeApiServer::Claim(const std::string& namespace_, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = claims_.find(namespace_ + "/" + name);
  return it == claims_.end() ? json() : it->second;
}

json FakeApiServer::PutPod(json pod) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& meta = pod["metadata"];
  if (!meta.contains("uid")) meta["uid"] = "pod-uid-" + std::to_string(next_uid_++);
  if (!meta.contains("namespace")) meta["namespace"] = "default";
  meta["resourceVersion"] = std::to_string(NextRv());
  pod["apiVersion"] = "v1";
  pod["kind"] = "Pod";
  pods_[meta["namespace"].get<std::string>() + "/" + meta["name"].get<std::string>()] = pod;
  return pod;
}

void FakeApiServer::RemovePod(const std::string& namespace_, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  pods_.erase(namespace_ + "/" + name);
}

void FakeApiServer::ServePod(const httplib::Request& req, httplib::Response& res,
                             const std::string& namespace_, const std::string& name) const {
  if (req.method != "GET") return ReplyMethodNotAllowed(res);
  auto it = pods_.find(namespace_ + "/" + name);
  if (it == pods_.end()) {
    return ReplyStatus(res, 404, "NotFound", "pods \"" + name + "\" not found", "pods", name, "");
  }
  Reply(res, 200, it->second);
}

void FakeApiServer::ServeClaimStatus(const httplib::Request& req, httplib::Response& res,
                                     const std::string& version, const std::string& namespace_,
                                     const std::string& name) {
  const std::string key = namespace_ + "/" + name;
  auto not_found = [&] {
    ReplyStatus(res, 404, "NotFound", "resourceclaims.resource.k8s.io \"" + name + "\" not found",
                "resourceclaims", name);
  };
  if (req.method == "GET") {
    auto it = claims_.find(key);
    if (it == claims_.end()) return not_found();
    json claim = it->second;
    claim["apiVersion"] = "resource.k8s.io/" + version;
    return Reply(res, 200, claim);
  }
  if (req.method != "PATCH") return ReplyMethodNotAllowed(res);
  // The server validates the patch options before it looks the object up.
  if (!AcceptApplyRequest(req, res)) return;
  auto it = claims_.find(key);
  if (it == claims_.end()) return not_found();
  const json body = json::parse(req.body, nullptr, false);
  if (!AcceptApplyBody(body, version, namespace_, name, res)) return;
  const json& meta = body["metadata"];
  const std::string stored_uid = it->second["metadata"].value("uid", "");
  if (meta.contains("uid") && StringOr(meta, "uid") != stored_uid) {
    return ReplyStatus(res, 409, "Conflict",
                       "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"" + name +
                           "\": StorageError: invalid object, Code: 4, Key: "
                           "/registry/resource.k8s.io/resourceclaims/" +
                           key +
                           ", ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
                           "UID in precondition: " +
                           StringOr(meta, "uid") + ", UID in object meta: " + stored_uid,
                       "resourceclaims", name);
  }
  // A resourceVersion in an apply body is a precondition, as in an update.
  const std::string stored_rv = it->second["metadata"].value("resourceVersion", "");
  if (meta.contains("resourceVersion") && StringOr(meta, "resourceVersion") != stored_rv) {
    return ReplyStatus(res, 409, "Conflict",
                       "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"" + name +
                           "\": the object has been modified; please apply your changes to the "
                           "latest version and try again",
                       "resourceclaims", name);
  }
  json applied;
  if (!DecodeAppliedDevices(body, res, applied)) return;
  const std::set<std::string> allocated = AllocatedDevices(it->second);
  std::set<std::string> keys;
  for (size_t i = 0; i < applied.size(); ++i) {
    const std::string path = "status.devices[" + std::to_string(i) + "]";
    std::string field;
    std::string problem = ValidateDeviceEntry(applied[i], path, allocated, field);
    if (problem.empty() && !keys.insert(DeviceKey(applied[i])).second) {
      field = path;
      problem = "Duplicate value: " + DeviceKeyFields(applied[i]).dump();
    }
    if (!problem.empty()) return ReplyInvalidClaim(res, name, field, problem);
  }
  const std::string manager = req.get_param_value("fieldManager");
  if (req.get_param_value("force") != "true") {
    const std::string conflict = ApplyConflict(it->second, device_owners_[key], manager, applied);
    if (!conflict.empty()) {
      return ReplyStatus(res, 409, "Conflict", "Apply failed with 1 conflict: " + conflict,
                         "resourceclaims", name);
    }
  }
  MergeAppliedDevices(it->second, manager, applied);
  json claim = it->second;
  claim["apiVersion"] = "resource.k8s.io/" + version;
  Reply(res, 200, claim);
}

void FakeApiServer::MergeAppliedDevices(json& claim, const std::string& manager,
                                        const json& applied) {
  const std::string claim_key = claim["metadata"]["namespace"].get<std::string>() + "/" +
                                claim["metadata"]["name"].get<std::string>();
  auto& owners = device_owners_[claim_key];
  json& status = claim["status"];
  if (!status.is_object()) status = json::object();
  json devices = status.contains("devices") && status["devices"].is_array() ? status["devices"]
                                                                            : json::array();
  std::set<std::string> applied_keys;
  for (const json& entry : applied) applied_keys.insert(DeviceKey(entry));
  const auto owned_by_another = [&](const std::string& key) {
    for (const auto& [other, keys] : owners) {
      if (other != manager && keys.count(key)) return true;
    }
    return false;
  };
  // Entries this manager no longer applies go, unless another manager still owns them.
  for (auto entry = devices.begin(); entry != devices.end();) {
    const std::string key = DeviceKey(*entry);
    if (owners[manager].count(key) && !applied_keys.count(key) && !owned_by_another(key)) {
      entry = devices.erase(entry);
    } else {
      ++entry;
    }
  }
  for (const json& entry : applied) {
    const std::string key = DeviceKey(entry);
    auto existing = std::find_if(devices.begin(), devices.end(),
                                 [&](const json& d) { return DeviceKey(d) == key; });
    if (existing == devices.end()) {
      devices.push_back(entry);
      continue;
    }
    if (*existing != entry) {
      // A changed entry is taken over (the apply was forced or nobody else owned it).
      for (auto& [other, keys] : owners) {
        if (other != manager) keys.erase(key);
      }
      *existing = entry;
    }
  }
  owners[manager] = applied_keys;
  std::erase_if(owners, [](const auto& owner) { return owner.second.empty(); });
  if (devices.empty()) {
    status.erase("devices");
  } else {
    status["devices"] = devices;
  }
  claim["metadata"]["resourceVersion"] = std::to_string(NextRv());
  if (owners.empty()) {
    claim["metadata"].erase("managedFields");
  } else {
    claim["metadata"]["managedFields"] = ManagedFields(owners);
  }
}

void FakeApiServer::PutNode(const std::string& name, const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_[name] = {{"apiVersion", "v1"},
                  {"kind", "Node"},
                  {"metadata", {{"name", name}, {"uid", uid}, {"resourceVersion", "1"}}}};
}

std::vector<json> FakeApiServer::Slices() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  for (const auto& [name, slice] : slices_) out.push_back(slice);
  return out;
}

bool FakeApiServer::WaitForSlices(const std::function<bool(const std::vector<json>&)>& done,
                                  std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    std::vector<json> slices;
    for (const auto& [name, slice] : slices_) slices.push_back(slice);
    return done(slices);
  });
}

json FakeApiServer::PutSlice(json slice) {
  std::lock_guard<std::mutex> lock(mu_);
  json& meta = slice["metadata"];
  const std::string name = meta.value("name", "");
  auto it = slices_.find(name);
  const bool exists = it != slices_.end();
  meta["uid"] =
      exists ? it->second["metadata"]["uid"] : json("slice-uid-" + std::to_string(next_uid_++));
  meta["resourceVersion"] = std::to_string(NextRv());
  meta["generation"] = exists ? it->second["metadata"].value("generation", 1) + 1 : 1;
  slice["apiVersion"] = "resource.k8s.io/v1";
  slice["kind"] = "ResourceSlice";
  slices_[name] = slice;
  Emit(exists ? "MODIFIED" : "ADDED", slice);
  return slice;
}

bool FakeApiServer::RemoveSlice(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slices_.find(name);
  if (it == slices_.end()) return false;
  json object = it->second;
  slices_.erase(it);
  object["metadata"]["resourceVersion"] = std::to_string(NextRv());
  Emit("DELETED", object);
  return true;
}

bool FakeApiServer::RemoveSliceUnwatched(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return slices_.erase(name) == 1;
}

void FakeApiServer::FailNext(int count, int status, int retry_after,
                             const std::string& path_prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(Fault{count, status, retry_after, path_prefix});
}

void FakeApiServer::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
}

bool FakeApiServer::WaitForRequests(
    const std::function<bool(const std::vector<RecordedRequest>&)>& done,
    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return done(requests_); });
}

bool FakeApiServer::WaitForClaim(const std::string& namespace_, const std::string& name,
                                 const std::function<bool(const json&)>& done,
                                 std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    auto it = claims_.find(namespace_ + "/" + name);
    return done(it == claims_.end() ? json() : it->second);
  });
}

size_t FakeApiServer::DeleteSlicesWhere(const std::string& field_selector) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FieldRequirement> selector;
  std::string error;
  if (!ParseFieldSelector(field_selector, selector, error)) return 0;
  return DeleteMatchingLocked(selector);
}

template <typename Selector>
size_t FakeApiServer::DeleteMatchingLocked(const Selector& selector) {
  size_t deleted = 0;
  for (auto it = slices_.begin(); it != slices_.end();) {
    if (Matches(it->second, selector)) {
      json object = it->second;
      object["metadata"]["resourceVersion"] = std::to_string(NextRv());
      Emit("DELETED", object);
      it = slices_.erase(it);
      ++deleted;
    } else {
      ++it;
    }
  }
  return deleted;
}

size_t FakeApiServer::SliceEvents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slice_events_made_;
}

size_t FakeApiServer::SliceWrites() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& r : requests_) {
    if (r.path.find("/resourceslices") != std::string::npos &&
        (r.method == "POST" || r.method == "PUT" || r.method == "DELETE")) {
      ++n;
    }
  }
  return n;
}

std::vector<RecordedRequest> FakeApiServer::Requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

size_t FakeApiServer::CountRequests(const std::string& method,
                                    const std::string& path_prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& r : requests_) {
    if (r.method == method && r.path.rfind(path_prefix, 0) == 0) ++n;
  }
  return n;
}

void FakeApiServer::ClearRequests() {
  std::lock_guard<std::mutex> lock(mu_);
  requests_.clear();
}

bool FakeApiServer::Admit(json& body, httplib::Response& res) const {
  if (!options_.partitionable_devices) DropPartitionableFields(body);
  std::string field;
  const std::string problem = ValidateSlice(body, std::stoi(options_.minor_version), field);
  if (problem.empty()) return true;
  const json& meta = body.contains("metadata") ? body["metadata"] : json::object();
  const std::string name = meta.value("name", meta.value("generateName", ""));
  json status = StatusBody(
      422, "Invalid",
      "ResourceSlice.resource.k8s.io \"" + name + "\" is invalid: " + field + ": " + problem,
      "ResourceSlice", name);
  status["details"]["causes"] =
      json::array({{{"reason", "FieldValueInvalid"}, {"message", problem}, {"field", field}}});
  Reply(res, 422, status);
  return false;
}

void FakeApiServer::InstallRoutes() {
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.hold_request) options_.hold_request();
    const std::vector<std::string> parts = SplitPath(req.path);
    std::unique_lock<std::mutex> lock(mu_);
    {
      RecordedRequest record;
      record.method = req.method;
      record.path = req.path;
      if (const size_t q = req.target.find('?'); q != std::string::npos) {
        record.query = req.target.substr(q + 1);
      }
      record.user_agent = req.get_header_value("User-Agent");
      record.authorization = req.get_header_value("Authorization");
      record.client_port = req.remote_port;
      requests_.push_back(record);
    }
    for (auto it = faults_.begin(); it != faults_.end(); ++it) {
      if (req.path.rfind(it->path_prefix, 0) != 0) continue;
      const int status = it->status;
      const int retry_after = it->retry_after;
      if (--it->remaining <= 0) faults_.erase(it);
      const std::string reason = status == 429   ? "TooManyRequests"
                                 : status == 409 ? "Conflict"
                                 : status == 403 ? "Forbidden"
                                 : status == 404 ? "NotFound"
                                 : status >= 500 ? "InternalError"
                                                 : "BadRequest";
      if (retry_after > 0) res.set_header("Retry-After", std::to_string(retry_after));
      ReplyStatus(res, status, reason, "injected fault");
      requests_.back().injected = true;
      return;
    }
    bool watch_expired = false;
    {
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      auto hit = [&](double p, int injected) {
        return p > 0 && (injected == 0 || uniform(random_) < p);
      };
      const bool slice_write =
          req.method != "GET" && req.path.find("/resourceslices") != std::string::npos;
      const bool slice_watch =
          req.method == "GET" && req.path.find("/resourceslices") != std::string::npos &&
          (req.get_param_value("watch") == "1" || req.get_param_value("watch") == "true");
      if (hit(mix_.drop, injected_.drop)) {
        ++injected_.drop;
        res.status = 200;
        res.set_content_provider(1024, "application/json", [](size_t, size_t, httplib::DataSink&) {
          return false;
        });  // no body: a broken connection
        return;
      }
      if (hit(mix_.server_error, injected_.server_error)) {
        ++injected_.server_error;
        return ReplyStatus(res, 500, "InternalError", "injected fault: internal error");
      }
      if (hit(mix_.throttle, injected_.throttle)) {
        ++injected_.throttle;
        res.set_header("Retry-After", "1");
        return ReplyStatus(res, 429, "TooManyRequests", "injected fault: too many requests");
      }
      if (slice_write && hit(mix_.conflict, injected_.conflict)) {
        ++injected_.conflict;
        return ReplyStatus(res, 409, "Conflict",
                           "injected fault: the object has been modified; please apply your "
                           "changes to the latest version and try again");
      }
      if (slice_watch && hit(mix_.watch_expired, injected_.watch_expired)) {
        ++injected_.watch_expired;
        watch_expired = true;
      }
      if (hit(mix_.slow, injected_.slow)) {
        ++injected_.slow;
        const auto delay = mix_.delay;
        lock.unlock();
        std::this_thread::sleep_for(delay);  // a slow server, not synchronization
        lock.lock();
      }
    }
    if (!options_.token.empty() &&
        req.get_header_value("Authorization") != "Bearer " + options_.token) {
      ReplyStatus(res, 401, "Unauthorized", "Unauthorized");
      return;
    }
    // As the real server's default --authorization-always-allow-paths: anyone may ask. A server
    // shutting down fails its readiness first, as the real one does.
    if (parts.size() == 1 && parts[0] == "readyz") {
      res.status = stopping_ ? 503 : 200;
      res.set_content(stopping_ ? "shutting down" : "ok", "text/plain");
      return;
    }
    // As in the real server, authorization follows authentication and precedes every handler,
    // so a denied request never reaches (or changes) the store.
    if (rbac_) {
      const RequestAttributes attributes = ResolveRequest(req.method, req.path, req.params);
      const RbacDecision decision = rbac_->Authorize(attributes);
      if (!decision.allowed) {
        return Reply(res, 403, ForbiddenStatus(attributes, rbac_->user(), decision.reason));
      }
    }

    if (parts.size() == 1 && parts[0] == "version") {
      Reply(res, 200,
            {{"major", "1"},
             {"minor", options_.minor_version},
             {"gitVersion", "v1." + options_.minor_version + ".0"},
             {"platform", "linux/amd64"}});
      return;
    }
    if (parts.size() == 1 && parts[0] == "apis") {
      json groups = json::array();
      if (!options_.served_versions.empty()) {
        json versions = json::array();
        for (const char* v : {"v1", "v1beta2", "v1beta1"}) {
          if (options_.served_versions.count(v)) {
            versions.push_back(
                {{"groupVersion", std::string("resource.k8s.io/") + v}, {"version", v}});
          }
        }
        groups.push_back({{"name", "resource.k8s.io"},
                          {"versions", versions},
                          {"preferredVersion", versions[0]}});
      }
      Reply(res, 200, {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}});
      return;
    }
    if (parts.size() >= 2 && parts[0] == "apis" && parts[1] == "resource.k8s.io") {
      if (parts.size() == 2) {
        if (options_.served_versions.empty()) return ReplyPageNotFound(res);
        json versions = json::array();
        for (const char* v : {"v1", "v1beta2", "v1beta1"}) {
          if (options_.served_versions.count(v)) {
            versions.push_back(
                {{"groupVersion", std::string("resource.k8s.io/") + v}, {"version", v}});
          }
        }
        Reply(res, 200,
              {{"kind", "APIGroup"},
               {"apiVersion", "v1"},
               {"name", "resource.k8s.io"},
               {"versions", versions},
               {"preferredVersion", versions[0]}});
        return;
      }
      const std::string& version = parts[2];
      if (!options_.served_versions.count(version)) return ReplyPageNotFound(res);
      if (parts.size() == 3) {
        json resources = json::array();
        resources.push_back({{"name", "resourceslices"},
                             {"singularName", "resourceslice"},
                             {"namespaced", false},
                             {"kind", "ResourceSlice"},
                             {"verbs",
                              {"create", "delete", "deletecollection", "get", "list", "patch",
                               "update", "watch"}}});
        resources.push_back(
            {{"name", "resourceclaims"},
             {"singularName", "resourceclaim"},
             {"namespaced", true},
             {"kind", "ResourceClaim"},
             {"verbs", {"create", "delete", "get", "list", "patch", "update", "watch"}}});
        Reply(res, 200,
              {{"kind", "APIResourceList"},
               {"apiVersion", "v1"},
               {"groupVersion", "resource.k8s.io/" + version},
               {"resources", resources}});
        return;
      }
      // Claims: /apis/resource.k8s.io/<v>/namespaces/<ns>/resourceclaims/<name>[/status]
      if (parts.size() == 8 && parts[3] == "namespaces" && parts[5] == "resourceclaims" &&
          parts[7] == "status") {
        return ServeClaimStatus(req, res, version, parts[4], parts[6]);
      }
      if (parts.size() == 7 && parts[3] == "namespaces" && parts[5] == "resourceclaims" &&
          req.method != "GET") {
        return ReplyMethodNotAllowed(res);
      }
      if (parts.size() == 7 && parts[3] == "namespaces" && parts[5] == "resourceclaims" &&
          req.method == "GET") {
        auto it = claims_.find(parts[4] + "/" + parts[6]);
        if (it == claims_.end()) {
          return ReplyStatus(res, 404, "NotFound",
                             "resourceclaims.resource.k8s.io \"" + parts[6] + "\" not found",
                             "resourceclaims", parts[6]);
        }
        json claim = it->second;
        claim["apiVersion"] = "resource.k8s.io/" + version;
        return Reply(res, 200, claim);
      }
      if (parts.size() >= 4 && parts[3] == "resourceslices") {
        const std::string name = parts.size() == 5 ? parts[4] : "";
        if (req.method == "GET" && name.empty()) {
          std::vector<FieldRequirement> selector;
          std::string error;
          if (!ParseFieldSelector(req.get_param_value("fieldSelector"), selector, error)) {
            return ReplyStatus(res, 400, "BadRequest", error);
          }
          const std::string watch = req.get_param_value("watch");
          if (watch == "1" || watch == "true") {
            const std::string rv_text = req.get_param_value("resourceVersion");
            long long from = rv_text.empty() ? 0 : std::atoll(rv_text.c_str());
            const bool bookmarks = req.get_param_value("allowWatchBookmarks") == "true";
            const int timeout = req.has_param("timeoutSeconds")
                                    ? std::atoi(req.get_param_value("timeoutSeconds").c_str())
                                    : 1800;
            std::deque<std::string> initial;
            if (watch_expired ||
                (from > 0 && !slice_events_.empty() && from < slice_events_.front().rv - 1)) {
              initial.push_back(
                  json({{"type", "ERROR"},
                        {"object",
                         StatusBody(410, "Expired", "too old resource version: " + rv_text)}})
                      .dump() +
                  "\n");
              from = -1;  // nothing follows the error
            } else if (from == 0) {
              for (const auto& [n, s] : slices_) {
                if (Matches(s, selector)) {
                  initial.push_back(
                      json({{"type", "ADDED"}, {"object", SliceToVersion(s, version)}}).dump() +
                      "\n");
                }
              }
              from = rv_;
            }
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);
            auto last = std::make_shared<long long>(from);
            auto pending = std::make_shared<std::deque<std::string>>(std::move(initial));
            res.status = 200;
            res.set_chunked_content_provider(
                "application/json", [this, last, pending, selector, version, deadline, bookmarks](
                                        size_t, httplib::DataSink& sink) {
                  std::unique_lock<std::mutex> l(mu_);
                  while (true) {
                    while (!pending->empty()) {
                      std::string line = std::move(pending->front());
                      pending->pop_front();
                      l.unlock();
                      if (options_.hold_watch_event) options_.hold_watch_event();
                      const bool ok = sink.write(line.data(), line.size());
                      l.lock();
                      if (!ok) return false;
                    }
                    if (*last < 0 || stopping_ || std::chrono::steady_clock::now() >= deadline) {
                      if (bookmarks && *last >= 0 && !stopping_) {
                        std::string line =
                            json({{"type", "BOOKMARK"},
                                  {"object",
                                   {{"kind", "ResourceSlice"},
                                    {"apiVersion", "resource.k8s.io/" + version},
                                    {"metadata", {{"resourceVersion", std::to_string(rv_)}}}}}})
                                .dump() +
                            "\n";
                        l.unlock();
                        sink.write(line.data(), line.size());
                        l.lock();
                      }
                      l.unlock();
                      sink.done();
                      return true;
                    }
                    for (const Event& e : slice_events_) {
                      if (e.rv <= *last) continue;
                      *last = e.rv;
                      if (Matches(e.object, selector)) {
                        pending->push_back(
                            json({{"type", e.type}, {"object", SliceToVersion(e.object, version)}})
                                .dump() +
                            "\n");
                      }
                    }
                    if (pending->empty()) {
                      changed_.wait_until(l,
                                          std::min(deadline, std::chrono::steady_clock::now() +
                                                                 std::chrono::milliseconds(200)));
                      if (!sink.is_writable()) return false;
                    }
                  }
                });
            return;
          }
          json items = json::array();
          for (const auto& [n, s] : slices_) {
            if (Matches(s, selector)) items.push_back(SliceToVersion(s, version));
          }
          return Reply(res, 200,
                       {{"kind", "ResourceSliceList"},
                        {"apiVersion", "resource.k8s.io/" + version},
                        {"metadata", {{"resourceVersion", std::to_string(rv_)}}},
                        {"items", items}});
        }
        if (req.method == "GET") {
          auto it = slices_.find(name);
          if (it == slices_.end()) {
            return ReplyStatus(res, 404, "NotFound",
                               "resourceslices.resource.k8s.io \"" + name + "\" not found",
                               "resourceslices", name);
          }
          return Reply(res, 200, SliceToVersion(it->second, version));
        }
        json body = json::parse(req.body, nullptr, false);
        if (req.method == "POST" && name.empty()) {
          if (body.is_discarded() || !body.is_object()) {
            return ReplyStatus(res, 400, "BadRequest", "the request body is not a JSON object");
          }
          if (!Admit(body, res)) return;
          json slice = SliceFromVersion(body, version);
          auto& meta = slice["metadata"];
          std::string new_name = meta.value("name", "");
          if (new_name.empty()) {
            const std::string prefix = meta.value("generateName", "");
            if (prefix.empty()) {
              return ReplyStatus(res, 422, "Invalid",
                                 "ResourceSlice.resource.k8s.io \"\" is invalid: metadata.name: "
                                 "Required value: name or generateName is required");
            }
            do {
              new_name = prefix.substr(0, 58) + RandomSuffix();
            } while (slices_.count(new_name));
          } else if (slices_.count(new_name)) {
            return ReplyStatus(res, 409, "AlreadyExists",
                               "resourceslices.resource.k8s.io \"" + new_name + "\" already exists",
                               "resourceslices", new_name);
          }
          meta["name"] = new_name;
          meta["uid"] = "slice-uid-" + std::to_string(next_uid_++);
          meta["resourceVersion"] = std::to_string(NextRv());
          meta["generation"] = 1;
          if (options_.alter_stored_slice) options_.alter_stored_slice(slice);
          slices_[new_name] = slice;
          Emit("ADDED", slice);
          return Reply(res, 201, SliceToVersion(slice, version));
        }
        if (req.method == "PUT" && !name.empty()) {
          auto it = slices_.find(name);
          if (it == slices_.end()) {
            return ReplyStatus(res, 404, "NotFound",
                               "resourceslices.resource.k8s.io \"" + name + "\" not found",
                               "resourceslices", name);
          }
          if (body.is_discarded() || !body.is_object()) {
            return ReplyStatus(res, 400, "BadRequest", "the request body is not a JSON object");
          }
          if (!Admit(body, res)) return;
          json slice = SliceFromVersion(body, version);
          const std::string sent_rv = slice["metadata"].value("resourceVersion", "");
          const std::string have_rv = it->second["metadata"]["resourceVersion"];
          if (!sent_rv.empty() && sent_rv != have_rv) {
            return ReplyStatus(res, 409, "Conflict",
                               "Operation cannot be fulfilled on resourceslices.resource.k8s.io "
                               "\"" +
                                   name +
                                   "\": the object has been modified; please apply "
                                   "your changes to the latest version and try again",
                               "resourceslices", name);
          }
          slice["metadata"]["uid"] = it->second["metadata"]["uid"];
          slice["metadata"]["resourceVersion"] = std::to_string(NextRv());
          slice["metadata"]["generation"] = it->second["metadata"].value("generation", 1) + 1;
          if (options_.alter_stored_slice) options_.alter_stored_slice(slice);
          it->second = slice;
          Emit("MODIFIED", slice);
          return Reply(res, 200, SliceToVersion(slice, version));
        }
        if (req.method == "DELETE" && name.empty()) {
          std::vector<FieldRequirement> selector;
          std::string error;
          if (!ParseFieldSelector(req.get_param_value("fieldSelector"), selector, error)) {
            return ReplyStatus(res, 400, "BadRequest", error);
          }
          DeleteMatchingLocked(selector);
          return Reply(res, 200, {{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Success"}});
        }
        if (req.method == "DELETE" && !name.empty()) {
          auto it = slices_.find(name);
          if (it == slices_.end()) {
            return ReplyStatus(res, 404, "NotFound",
                               "resourceslices.resource.k8s.io \"" + name + "\" not found",
                               "resourceslices", name);
          }
          if (body.is_object() && body.contains("preconditions")) {
            const json& pre = body["preconditions"];
            const json& meta = it->second["metadata"];
            if ((pre.contains("uid") && pre["uid"] != meta["uid"]) ||
                (pre.contains("resourceVersion") &&
                 pre["resourceVersion"] != meta["resourceVersion"])) {
              return ReplyStatus(res, 409, "Conflict",
                                 "Operation cannot be fulfilled on resourceslices.resource.k8s.io "
                                 "\"" +
                                     name + "\": the precondition does not match",
                                 "resourceslices", name);
            }
          }
          json object = it->second;
          slices_.erase(it);
          object["metadata"]["resourceVersion"] = std::to_string(NextRv());
          Emit("DELETED", object);
          return Reply(res, 200, SliceToVersion(object, version));
        }
      }
      return ReplyPageNotFound(res);
    }
    if (parts.size() == 6 && parts[0] == "api" && parts[1] == "v1" && parts[2] == "namespaces" &&
        parts[4] == "pods") {
      return ServePod(req, res, parts[3], parts[5]);
    }
    if (parts.size() == 4 && parts[0] == "api" && parts[1] == "v1" && parts[2] == "nodes" &&
        req.method == "GET") {
      auto it = nodes_.find(parts[3]);
      if (it == nodes_.end()) {
        return ReplyStatus(res, 404, "NotFound", "nodes \"" + parts[3] + "\" not found", "nodes",
                           parts[3], "");
      }
      return Reply(res, 200, it->second);
    }
    ReplyPageNotFound(res);
  };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Delete(".*", handler);
  server_->Patch(".*", handler);
  // Before the response is written, so that a client that has its answer finds it recorded.
  server_->set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = requests_.rbegin(); it != requests_.rend(); ++it) {
      if (it->status == 0 && it->method == req.method && it->path == req.path) {
        it->status = res.status;
        break;
      }
    }
    changed_.notify_all();
  });
}

}  // namespace vfio_dra::testing
