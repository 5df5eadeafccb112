// ResourceSlice JSON in the served API version: v1 and v1beta2 share one shape, v1beta1 wraps
// every device field but the name in `basic`. Reading a server object back yields SliceContent
// for comparison with the desired state; quantities are compared by value ("1000" == "1k").
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "base/result.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

struct SliceMeta {
  std::string api_version = "v1";  // v1 | v1beta2 | v1beta1
  std::string driver;
  std::string node_name;
  std::string pool_name;
  int64_t generation = 0;
  int64_t slice_count = 1;
  std::string node_uid;  // owner reference; empty: none
  std::string name;      // empty: generateName "<node>-<driver>-"
  std::string resource_version;
};

// A DeviceAttribute as the API writes it: {"int": 4}, {"string": "0000:3b:00.0"}, ...
nlohmann::json AttributeJson(const AttributeValue& value);
// The value AttributeJson wrote; nullopt when `value` is not one of those shapes.
std::optional<AttributeValue> AttributeFromJson(const nlohmann::json& value);

nlohmann::json SliceToJson(const SliceContent& content, const SliceMeta& meta);

// Reads spec.devices / spec.sharedCounters of a server object (either shape).
Result<SliceContent> SliceContentFromJson(const nlohmann::json& slice);

// Parses an integer Kubernetes quantity ("24", "1k", "2Ki", "1e3").
Result<int64_t> ParseIntegerQuantity(const std::string& text);

}  // namespace vfio_dra::slicepublisher
