#include "slicepublisher/slice_digest.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace vfio_dra::slicepublisher {
namespace {

void AddCounters(Sha256Stream& sha, const std::map<std::string, int64_t>& counters) {
  sha.Field(static_cast<int64_t>(counters.size()));
  for (const auto& [name, value] : counters) sha.Field(name).Field(value);
}

void AddAttribute(Sha256Stream& sha, const AttributeValue& value) {
  sha.Field(static_cast<int64_t>(value.index()));  // the type, so 1 and true differ
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          sha.Field(static_cast<int64_t>(v ? 1 : 0));
        } else if constexpr (std::is_same_v<T, VersionString>) {
          sha.Field(v.value);
        } else {
          sha.Field(v);  // int64_t or std::string
        }
      },
      value);
}

Sha256 NamesDigest(const SliceContent& content) {
  std::vector<std::string> names;
  names.reserve(content.devices.size() + content.shared_counters.size());
  for (const auto& d : content.devices) names.push_back("d:" + d.name);
  for (const auto& c : content.shared_counters) names.push_back("c:" + c.name);
  std::sort(names.begin(), names.end());
  Sha256Stream sha;
  sha.Field(static_cast<int64_t>(names.size()));
  for (const auto& n : names) sha.Field(n);
  return sha.Finish();
}

// Every field of the content in order, counts before lists: equal feeds exactly when the
// contents are equal (what SliceContent's operator== compares), with no JSON built on the way.
Sha256 ContentDigest(const SliceContent& content) {
  Sha256Stream sha;
  sha.Field(static_cast<int64_t>(content.devices.size()));
  for (const SliceDevice& device : content.devices) {
    sha.Field(device.name).Field(static_cast<int64_t>(device.attributes.size()));
    for (const auto& [name, value] : device.attributes) {
      sha.Field(name);
      AddAttribute(sha, value);
    }
    sha.Field(static_cast<int64_t>(device.consumes_counters.size()));
    for (const CounterConsumption& consumption : device.consumes_counters) {
      sha.Field(consumption.counter_set);
      AddCounters(sha, consumption.counters);
    }
    sha.Field(static_cast<int64_t>(device.taints.size()));
    for (const DeviceTaint& taint : device.taints) {
      sha.Field(taint.key).Field(taint.value).Field(taint.effect);
      sha.Field(taint.time_added);
    }
  }
  sha.Field(static_cast<int64_t>(content.shared_counters.size()));
  for (const CounterSet& set : content.shared_counters) {
    sha.Field(set.name);
    AddCounters(sha, set.counters);
  }
  return sha.Finish();
}

}  // namespace

SliceDigest DigestOf(const SliceContent& content) {
  return {NamesDigest(content), ContentDigest(content)};
}

}  // namespace vfio_dra::slicepublisher
