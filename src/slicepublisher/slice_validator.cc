#include "slicepublisher/slice_validator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "base/k8s_names.h"

namespace vfio_dra::slicepublisher {
namespace {

bool IsCIdentifier(const std::string& text) {
  if (text.empty() || text.size() > 32) return false;
  if (!std::isalpha(static_cast<unsigned char>(text[0])) && text[0] != '_') return false;
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// A semver number as 1.38's server takes it: no leading zero and at most 18 digits (so that it fits
// an int64), in MAJOR.MINOR.PATCH and in digit-only pre-release identifiers alike.
bool IsSemverNumber(const std::string& text, size_t start, size_t end) {
  if (end == start || end - start > 18 || (end - start > 1 && text[start] == '0')) return false;
  return std::all_of(text.begin() + static_cast<std::ptrdiff_t>(start),
                     text.begin() + static_cast<std::ptrdiff_t>(end),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

bool IsSemver(const std::string& text) {
  // MAJOR.MINOR.PATCH with optional -pre and +build.
  size_t i = 0;
  for (int part = 0; part < 3; ++part) {
    const size_t start = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (!IsSemverNumber(text, start, i)) return false;
    if (part < 2) {
      if (i >= text.size() || text[i] != '.') return false;
      ++i;
    }
  }
  if (i == text.size()) return true;
  if (text[i] != '-' && text[i] != '+') return false;
  bool pre_release = text[i] == '-';
  size_t identifier = i + 1;
  for (++i; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : '.';
    if (c == '.' || c == '+') {
      const bool digits_only =
          std::all_of(text.begin() + static_cast<std::ptrdiff_t>(identifier),
                      text.begin() + static_cast<std::ptrdiff_t>(i),
                      [](char d) { return std::isdigit(static_cast<unsigned char>(d)) != 0; });
      if (pre_release && digits_only && !IsSemverNumber(text, identifier, i)) return false;
      if (c == '+') pre_release = false;
      identifier = i + 1;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return true;
}

Error Rule(size_t slice, const std::string& where, const std::string& rule) {
  return MakeError(ErrorKind::kInvalidArgument,
                   fmt::format("ResourceSlice #{} of the pool: {}: {}", slice, where, rule));
}

}  // namespace

bool IsQualifiedName(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return IsCIdentifier(name);
  if (name.find('/', slash + 1) != std::string::npos) return false;
  const std::string domain = name.substr(0, slash);
  return domain.size() <= 63 && IsDnsSubdomain(domain) && IsCIdentifier(name.substr(slash + 1));
}

namespace {

using CounterNames = std::map<std::string, std::set<std::string>>;  // set -> counter names

Status ValidateCounterSets(size_t s, const SliceContent& slice, const ValidationTarget& target,
                           CounterNames& counter_sets) {
  const bool v135 = target.kubernetes_minor >= 35;
  if (!slice.shared_counters.empty() && target.layout == CounterLayout::kNone) {
    return Rule(s, "spec.sharedCounters", "counters are not supported by this server");
  }
  if (target.kubernetes_minor < 33 && !slice.shared_counters.empty()) {
    return Rule(s, "spec.sharedCounters", "not available before Kubernetes 1.33");
  }
  if (v135 && slice.shared_counters.size() > 8) {
    return Rule(
        s, "spec.sharedCounters",
        fmt::format("must have at most 8 counter sets, has {}", slice.shared_counters.size()));
  }
  size_t total_counters = 0;
  for (const CounterSet& set : slice.shared_counters) {
    if (!IsDnsLabel(set.name)) {
      return Rule(s, "counter set " + set.name, "name must be a DNS label");
    }
    if (counter_sets.count(set.name)) {
      return Rule(s, "counter set " + set.name, "duplicate counter set name in the pool");
    }
    if (set.counters.empty() || set.counters.size() > 32) {
      return Rule(s, "counter set " + set.name, "must have 1 to 32 counters");
    }
    for (const auto& [name, value] : set.counters) {
      if (!IsDnsLabel(name)) {
        return Rule(s, "counter set " + set.name, "counter name " + name + " must be a DNS label");
      }
      if (value < 0) return Rule(s, "counter set " + set.name, "counter values must be >= 0");
      counter_sets[set.name].insert(name);
    }
    total_counters += set.counters.size();
  }
  if (!v135 && total_counters > 32) {
    return Rule(s, "spec.sharedCounters",
                fmt::format("the total number of shared counters must not exceed 32, has {}",
                            total_counters));
  }
  return Status::Ok();
}

// A label value: at most 63 of [A-Za-z0-9_.-], starting and ending alphanumeric (or empty).
bool IsLabelValue(const std::string& text) {
  if (text.empty()) return true;
  if (text.size() > 63 || !std::isalnum(static_cast<unsigned char>(text.front())) ||
      !std::isalnum(static_cast<unsigned char>(text.back()))) {
    return false;
  }
  return std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// A label name: an optional DNS-subdomain prefix and "/", then at most 63 of [A-Za-z0-9_.-]
// starting and ending alphanumeric.
bool IsLabelName(const std::string& text) {
  const size_t slash = text.find('/');
  const std::string name = slash == std::string::npos ? text : text.substr(slash + 1);
  if (slash != std::string::npos) {
    const std::string prefix = text.substr(0, slash);
    if (prefix.empty() || prefix.size() > 253 || !IsDnsSubdomain(prefix)) return false;
  }
  return !name.empty() && IsLabelValue(name);
}

Status ValidateTaints(size_t s, const SliceDevice& device, const ValidationTarget& target) {
  if (device.taints.empty()) return Status::Ok();
  const std::string where = "device " + device.name + " taints";
  if (!target.taints) return Rule(s, where, "taints are not supported by this server");
  const size_t max_taints = target.kubernetes_minor >= 37 ? 16 : 4;
  if (device.taints.size() > max_taints) {
    return Rule(
        s, where,
        fmt::format("must have at most {} items, has {}", max_taints, device.taints.size()));
  }
  for (const DeviceTaint& taint : device.taints) {
    if (!IsLabelName(taint.key)) {
      return Rule(s, where, "key \"" + taint.key + "\" is not a label name");
    }
    if (!IsLabelValue(taint.value)) {
      return Rule(s, where,
                  "value \"" + taint.value + "\" of " + taint.key + " is not a label value");
    }
    if (taint.effect != kEffectNone && taint.effect != kEffectNoSchedule &&
        taint.effect != "NoExecute") {
      return Rule(s, where,
                  "effect \"" + taint.effect + "\" of " + taint.key +
                      " is not None, NoSchedule or NoExecute");
    }
    if (taint.effect == kEffectNone && target.kubernetes_minor < 35) {
      return Rule(s, where, "effect None needs Kubernetes 1.35 or later");
    }
  }
  return Status::Ok();
}

// 1.38's server refuses names with two slashes; its Go helper (which a C++ driver has to mirror,
// the server does not check it) refuses names in the driver's own domain, because CEL would then
// see "<driver>/x" and "x" as one attribute. Every release gets the 1.38 rules so that a slice
// never becomes invalid on upgrade.
std::optional<std::string> AttributeNameProblem(const std::string& name,
                                                const std::string& driver) {
  const size_t slash = name.find('/');
  if (slash != std::string::npos && name.find('/', slash + 1) != std::string::npos) {
    return "attribute name \"" + name + "\" has more than one '/'";
  }
  if (!driver.empty() && name.rfind(driver + "/", 0) == 0) {
    return "attribute name \"" + name + "\" is qualified with the driver's own domain " + driver +
           "; publish it as \"" + name.substr(driver.size() + 1) + "\"";
  }
  if (!IsQualifiedName(name)) return "attribute name \"" + name + "\" is not a qualified name";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> AttributeProblem(const std::map<std::string, AttributeValue>& attributes,
                                            const std::string& driver) {
  if (attributes.size() > 32) {
    return fmt::format("at most 32 attributes and capacities, has {}", attributes.size());
  }
  for (const auto& [name, value] : attributes) {
    if (auto problem = AttributeNameProblem(name, driver)) return problem;
    if (const auto* text = std::get_if<std::string>(&value); text && text->size() > 64) {
      return "attribute " + name + " is longer than 64 characters";
    }
    if (const auto* version = std::get_if<VersionString>(&value)) {
      if (version->value.size() > 64 || !IsSemver(version->value)) {
        return "attribute " + name + " is not a semantic version (\"" + version->value +
               "\"; numbers have no leading zero and at most 18 digits)";
      }
    }
  }
  return std::nullopt;
}

namespace {

Status ValidateDevice(size_t s, const SliceDevice& device, const ValidationTarget& target,
                      std::set<std::string>& device_names) {
  const bool v135 = target.kubernetes_minor >= 35;
  const std::string where = "device " + device.name;
  if (!IsDnsLabel(device.name)) return Rule(s, where, "name must be a DNS label");
  if (!device_names.insert(device.name).second) {
    return Rule(s, where, "duplicate device name in the pool");
  }
  if (auto problem = AttributeProblem(device.attributes, target.driver)) {
    return Rule(s, where, *problem);
  }
  if (!device.consumes_counters.empty()) {
    if (target.layout == CounterLayout::kNone) {
      return Rule(s, where, "consumesCounters is not supported by this server");
    }
    if (v135 && device.consumes_counters.size() > 2) {
      return Rule(s, where, "at most 2 consumesCounters entries (1.35+)");
    }
  }
  for (const CounterConsumption& c : device.consumes_counters) {
    if (c.counters.empty() || c.counters.size() > 32) {
      return Rule(s, where, "consumesCounters entries need 1 to 32 counters");
    }
  }
  return ValidateTaints(s, device, target);
}

Status ValidateDevices(size_t s, const SliceContent& slice, const ValidationTarget& target,
                       std::set<std::string>& device_names) {
  const bool v135 = target.kubernetes_minor >= 35;
  bool any_advanced = false;
  size_t consumed = 0;
  for (const SliceDevice& device : slice.devices) {
    if (Status st = ValidateDevice(s, device, target, device_names); !st.ok()) return st;
    any_advanced = any_advanced || !device.consumes_counters.empty() || !device.taints.empty();
    for (const CounterConsumption& c : device.consumes_counters) consumed += c.counters.size();
  }
  const size_t max_devices = (v135 && any_advanced) ? 64 : 128;
  if (slice.devices.size() > max_devices) {
    return Rule(
        s, "spec.devices",
        fmt::format("must have at most {} items{}, has {}", max_devices,
                    max_devices == 64 ? " when devices consume counters or have taints" : "",
                    slice.devices.size()));
  }
  if (!v135 && consumed > 1024) {
    return Rule(s, "spec.devices",
                fmt::format("the total number of counters in devices must not exceed 1024, has {}",
                            consumed));
  }
  return Status::Ok();
}

// Pool-wide: every consumed counter exists; before 1.35 only in the device's own slice.
Status ValidateConsumedCounters(const DesiredPool& pool, const CounterNames& counter_sets,
                                bool v135) {
  for (size_t s = 0; s < pool.slices.size(); ++s) {
    std::set<std::string> local;
    for (const CounterSet& set : pool.slices[s].shared_counters) local.insert(set.name);
    for (const SliceDevice& device : pool.slices[s].devices) {
      for (const CounterConsumption& c : device.consumes_counters) {
        auto it = counter_sets.find(c.counter_set);
        if (it == counter_sets.end() || (!v135 && !local.count(c.counter_set))) {
          return Rule(s, "device " + device.name,
                      "consumes counter set " + c.counter_set + ", which is not " +
                          (v135 ? "in the pool" : "in the same slice (before 1.35)"));
        }
        for (const auto& [name, value] : c.counters) {
          if (!it->second.count(name)) {
            return Rule(s, "device " + device.name,
                        "consumes unknown counter " + name + " of set " + c.counter_set);
          }
          if (value < 0) return Rule(s, "device " + device.name, "consumes a negative amount");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidatePool(const DesiredPool& pool, const ValidationTarget& target) {
  if (target.driver.empty() || target.driver.size() > 63 || !IsDnsSubdomain(target.driver)) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "driver name \"" + target.driver + "\" must be a DNS subdomain of at most 63");
  }
  if (pool.name.empty() || pool.name.size() > 253 || !IsDnsSubdomain(pool.name)) {
    return MakeError(ErrorKind::kInvalidArgument, "pool name \"" + pool.name + "\" is invalid");
  }
  if (pool.slices.empty()) {
    return MakeError(ErrorKind::kInvalidArgument, "a pool needs at least one slice");
  }
  const bool v135 = target.kubernetes_minor >= 35;
  std::set<std::string> device_names;
  CounterNames counter_sets;
  for (size_t s = 0; s < pool.slices.size(); ++s) {
    const SliceContent& slice = pool.slices[s];
    if (v135 && !slice.devices.empty() && !slice.shared_counters.empty()) {
      return Rule(s, "spec", "only one of `sharedCounters` or `devices` is allowed (1.35+)");
    }
    if (Status st = ValidateCounterSets(s, slice, target, counter_sets); !st.ok()) return st;
    if (Status st = ValidateDevices(s, slice, target, device_names); !st.ok()) return st;
  }
  return ValidateConsumedCounters(pool, counter_sets, v135);
}

}  // namespace vfio_dra::slicepublisher
