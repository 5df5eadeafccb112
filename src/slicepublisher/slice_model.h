// The ResourceSlice content vfio-dra publishes, as plain values independent of the API version.
// slice_json turns it into v1/v1beta2/v1beta1 objects; the builder fills it from a NodeScan.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace vfio_dra::slicepublisher {

struct VersionString {
  std::string value;
  bool operator==(const VersionString&) const = default;
};

// One attribute value: exactly one of int, bool, string or version (as the API requires).
using AttributeValue = std::variant<int64_t, bool, std::string, VersionString>;

struct CounterConsumption {
  std::string counter_set;
  std::map<std::string, int64_t> counters;
  bool operator==(const CounterConsumption&) const = default;
};

// A device taint (KEP-5055). The plugin sets only None (degraded, still allocatable) and
// NoSchedule (a new VM would fail); eviction (NoExecute) is the admin's call, through a
// DeviceTaintRule. `time_added` is RFC 3339 UTC to the second: it is kept for as long as the same
// taint stays, so rebuilding the slices does not rewrite them.
inline constexpr char kEffectNone[] = "None";
inline constexpr char kEffectNoSchedule[] = "NoSchedule";

struct DeviceTaint {
  std::string key;  // "<driver>/<cause>", a label name
  std::string value;
  std::string effect;  // as the API spells it; a slice read back may hold any
  std::string time_added;
  bool operator==(const DeviceTaint&) const = default;
};

struct SliceDevice {
  std::string name;
  std::map<std::string, AttributeValue> attributes;  // qualified or driver-local names
  std::vector<CounterConsumption> consumes_counters;
  std::vector<DeviceTaint> taints = {};  // sorted by key
  bool operator==(const SliceDevice&) const = default;
};

struct CounterSet {
  std::string name;
  std::map<std::string, int64_t> counters;
  bool operator==(const CounterSet&) const = default;
};

struct SliceContent {
  std::vector<SliceDevice> devices;
  std::vector<CounterSet> shared_counters;
  bool operator==(const SliceContent&) const = default;
};

// Where shared counters go, by what the server accepts.
enum class CounterLayout {
  kNone,           // no counters at all (pre-1.33 servers, or the partitionable gate is off)
  kInDeviceSlice,  // 1.33 and 1.34: a counter set lives in the slice of the devices using it
  kOwnSlice,       // 1.35 and later: counter sets in slices of their own
};

struct DesiredPool {
  std::string name;  // the node name
  std::vector<SliceContent> slices;
  std::vector<std::string> warnings;  // devices left out, with the reason
  // Why each tainted device is tainted, by device name: taints carry a one-word value, and the
  // health stream and the logs carry this.
  std::map<std::string, std::string> taint_reasons;
  // Published devices kept although the scan no longer yields them as they are (KeptDevices).
  std::set<std::string> kept;
};

}  // namespace vfio_dra::slicepublisher
