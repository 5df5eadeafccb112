#include "slicepublisher/slice_json.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>

namespace vfio_dra::slicepublisher {
namespace {

using nlohmann::json;

json CountersJson(const std::map<std::string, int64_t>& counters) {
  json out = json::object();
  for (const auto& [name, value] : counters) out[name] = {{"value", std::to_string(value)}};
  return out;
}

Error Invalid(const std::string& what) {
  return MakeError(ErrorKind::kInvalidArgument, "ResourceSlice " + what);
}

Result<std::map<std::string, int64_t>> CountersFromJson(const json& counters,
                                                        const std::string& where) {
  std::map<std::string, int64_t> out;
  if (!counters.is_object()) return Invalid(where + " must be a map");
  for (const auto& [name, counter] : counters.items()) {
    if (!counter.is_object() || !counter.contains("value")) {
      return Invalid(where + "[" + name + "] has no value");
    }
    const json& value = counter["value"];
    auto parsed = value.is_string()           ? ParseIntegerQuantity(value.get<std::string>())
                  : value.is_number_integer() ? Result<int64_t>(value.get<int64_t>())
                                              : Result<int64_t>(Invalid(where + " value"));
    if (!parsed.ok()) return parsed.error();
    out[name] = *parsed;
  }
  return out;
}

// A device's taints as the server stores them.
Result<std::vector<DeviceTaint>> TaintsFromJson(const json& fields, const std::string& device) {
  std::vector<DeviceTaint> taints;
  auto list = fields.find("taints");
  if (list == fields.end() || list->is_null()) return taints;
  if (!list->is_array()) return Invalid("device " + device + " taints must be a list");
  for (const json& entry : *list) {
    if (!entry.is_object() || !entry.contains("key") || !entry["key"].is_string()) {
      return Invalid("device " + device + " has a taint without a key");
    }
    DeviceTaint taint;
    taint.key = entry["key"];
    taint.value = entry.value("value", "");
    taint.effect = entry.value("effect", "");
    taint.time_added = entry.value("timeAdded", "");
    taints.push_back(std::move(taint));
  }
  std::sort(taints.begin(), taints.end(),
            [](const DeviceTaint& a, const DeviceTaint& b) { return a.key < b.key; });
  return taints;
}

}  // namespace

json AttributeJson(const AttributeValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return {{"int", *i}};
  if (const auto* b = std::get_if<bool>(&value)) return {{"bool", *b}};
  if (const auto* s = std::get_if<std::string>(&value)) return {{"string", *s}};
  return {{"version", std::get<VersionString>(value).value}};
}

std::optional<AttributeValue> AttributeFromJson(const json& value) {
  if (!value.is_object()) return std::nullopt;
  if (value.contains("int") && value["int"].is_number_integer()) return value["int"].get<int64_t>();
  if (value.contains("bool") && value["bool"].is_boolean()) return value["bool"].get<bool>();
  if (value.contains("string") && value["string"].is_string()) {
    return value["string"].get<std::string>();
  }
  if (value.contains("version") && value["version"].is_string()) {
    return VersionString{value["version"].get<std::string>()};
  }
  return std::nullopt;
}

Result<int64_t> ParseIntegerQuantity(const std::string& text) {
  size_t i = 0;
  int64_t value = 0;
  if (text.empty()) return Invalid("quantity is empty");
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (value > std::numeric_limits<int64_t>::max() / 10) return Invalid("quantity overflows");
    value = value * 10 + (text[i] - '0');
    ++i;
  }
  if (i == 0) return Invalid("quantity \"" + text + "\" is not an integer");
  const std::string suffix = text.substr(i);
  int64_t multiplier = 1;
  static const std::pair<const char*, int64_t> kSuffixes[] = {{"", 1},
                                                              {"k", 1000LL},
                                                              {"M", 1000000LL},
                                                              {"G", 1000000000LL},
                                                              {"T", 1000000000000LL},
                                                              {"P", 1000000000000000LL},
                                                              {"E", 1000000000000000000LL},
                                                              {"Ki", 1LL << 10},
                                                              {"Mi", 1LL << 20},
                                                              {"Gi", 1LL << 30},
                                                              {"Ti", 1LL << 40},
                                                              {"Pi", 1LL << 50},
                                                              {"Ei", 1LL << 60}};
  bool known = false;
  for (const auto& [name, factor] : kSuffixes) {
    if (suffix == name) {
      multiplier = factor;
      known = true;
    }
  }
  if (!known && suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    int exponent = 0;
    for (size_t j = 1; j < suffix.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(suffix[j])) || exponent > 18) {
        return Invalid("quantity \"" + text + "\" is not an integer");
      }
      exponent = exponent * 10 + (suffix[j] - '0');
    }
    if (exponent > 18) return Invalid("quantity overflows");
    for (int j = 0; j < exponent; ++j) multiplier *= 10;
    known = true;
  }
  if (!known) return Invalid("quantity \"" + text + "\" is not an integer");
  if (value != 0 && multiplier > std::numeric_limits<int64_t>::max() / value) {
    return Invalid("quantity overflows");
  }
  return value * multiplier;
}

json SliceToJson(const SliceContent& content, const SliceMeta& meta) {
  json metadata = json::object();
  if (meta.name.empty()) {
    metadata["generateName"] = meta.node_name + "-" + meta.driver + "-";
  } else {
    metadata["name"] = meta.name;
  }
  if (!meta.resource_version.empty()) metadata["resourceVersion"] = meta.resource_version;
  if (!meta.node_uid.empty()) {
    metadata["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                                {"kind", "Node"},
                                                {"name", meta.node_name},
                                                {"uid", meta.node_uid},
                                                {"controller", true}}});
  }
  json spec = {{"driver", meta.driver},
               {"nodeName", meta.node_name},
               {"pool",
                {{"name", meta.pool_name},
                 {"generation", meta.generation},
                 {"resourceSliceCount", meta.slice_count}}}};
  // A counter-only slice must not carry `devices` at all (1.35+ rejects both being set).
  if (!content.devices.empty() || content.shared_counters.empty()) {
    json devices = json::array();
    for (const SliceDevice& device : content.devices) {
      json fields = json::object();
      json attributes = json::object();
      for (const auto& [name, value] : device.attributes) attributes[name] = AttributeJson(value);
      if (!attributes.empty()) fields["attributes"] = attributes;
      if (!device.consumes_counters.empty()) {
        json consumes = json::array();
        for (const CounterConsumption& c : device.consumes_counters) {
          consumes.push_back(
              {{"counterSet", c.counter_set}, {"counters", CountersJson(c.counters)}});
        }
        fields["consumesCounters"] = consumes;
      }
      if (!device.taints.empty()) {
        json taints = json::array();
        for (const DeviceTaint& taint : device.taints) {
          json entry = {{"key", taint.key}, {"effect", taint.effect}};
          if (!taint.value.empty()) entry["value"] = taint.value;
          if (!taint.time_added.empty()) entry["timeAdded"] = taint.time_added;
          taints.push_back(std::move(entry));
        }
        fields["taints"] = taints;
      }
      json entry = {{"name", device.name}};
      if (meta.api_version == "v1beta1") {
        entry["basic"] = fields;
      } else {
        entry.update(fields);
      }
      devices.push_back(entry);
    }
    spec["devices"] = devices;
  }
  if (!content.shared_counters.empty()) {
    json sets = json::array();
    for (const CounterSet& set : content.shared_counters) {
      sets.push_back({{"name", set.name}, {"counters", CountersJson(set.counters)}});
    }
    spec["sharedCounters"] = sets;
  }
  return {{"apiVersion", "resource.k8s.io/" + meta.api_version},
          {"kind", "ResourceSlice"},
          {"metadata", metadata},
          {"spec", spec}};
}

Result<SliceContent> SliceContentFromJson(const json& slice) {
  SliceContent content;
  if (!slice.is_object() || !slice.contains("spec") || !slice["spec"].is_object()) {
    return Invalid("has no spec");
  }
  const json& spec = slice["spec"];
  if (auto devices = spec.find("devices"); devices != spec.end() && !devices->is_null()) {
    if (!devices->is_array()) return Invalid("spec.devices must be a list");
    for (const json& entry : *devices) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) {
        return Invalid("device without a name");
      }
      SliceDevice device;
      device.name = entry["name"];
      const json& fields = entry.contains("basic") ? entry["basic"] : entry;
      if (fields.contains("attributes") && fields["attributes"].is_object()) {
        for (const auto& [name, value] : fields["attributes"].items()) {
          std::optional<AttributeValue> parsed = AttributeFromJson(value);
          if (!parsed) {
            return Invalid("device " + device.name + " attribute " + name + " has no value");
          }
          device.attributes[name] = std::move(*parsed);
        }
      }
      if (fields.contains("consumesCounters") && fields["consumesCounters"].is_array()) {
        for (const json& c : fields["consumesCounters"]) {
          CounterConsumption consumption;
          consumption.counter_set = c.value("counterSet", "");
          auto counters = CountersFromJson(c.value("counters", json::object()),
                                           "device " + device.name + " consumesCounters");
          if (!counters.ok()) return counters.error();
          consumption.counters = *counters;
          device.consumes_counters.push_back(std::move(consumption));
        }
      }
      if (auto taints = TaintsFromJson(fields, device.name); taints.ok()) {
        device.taints = std::move(*taints);
      } else {
        return taints.error();
      }
      content.devices.push_back(std::move(device));
    }
  }
  if (auto sets = spec.find("sharedCounters"); sets != spec.end() && !sets->is_null()) {
    if (!sets->is_array()) return Invalid("spec.sharedCounters must be a list");
    for (const json& s : *sets) {
      CounterSet set;
      set.name = s.value("name", "");
      auto counters =
          CountersFromJson(s.value("counters", json::object()), "counter set " + set.name);
      if (!counters.ok()) return counters.error();
      set.counters = *counters;
      content.shared_counters.push_back(std::move(set));
    }
  }
  return content;
}

}  // namespace vfio_dra::slicepublisher
