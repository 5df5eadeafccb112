#include "slicepublisher/mdev_type_maxima.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/file_io.h"

namespace vfio_dra::slicepublisher {
namespace {

constexpr int kLargestMaximum = 1 << 20;  // far above any real parent; guards the lcm

std::string ModelOf(const discovery::MdevParent& parent, const discovery::Inventory& inventory) {
  if (parent.pci_address.empty()) return "";
  const discovery::PciFunction* fn = inventory.Find(parent.pci_address);
  return fn == nullptr ? "" : fmt::format("{:04x}:{:04x}", fn->vendor_id, fn->device_id);
}

}  // namespace

const char* MaximumSourceName(MaximumSource source) {
  switch (source) {
    case MaximumSource::kNone:
      return "unknown";
    case MaximumSource::kVendor:
      return "stated by the vendor driver";
    case MaximumSource::kSeenEmpty:
      return "seen while the parent held no instance";
    case MaximumSource::kAvailablePlusUsed:
      return "available + existing instances (a lower bound)";
  }
  return "unknown";
}

bool MdevTypeMaxima::Observe(const discovery::Inventory& inventory) {
  const auto before = learned_;
  current_.clear();
  for (const discovery::MdevParent& parent : inventory.mdev_parents) {
    ParentRecord& record = learned_[parent.name];
    const std::string model = ModelOf(parent, inventory);
    if (record.model != model) record = ParentRecord{model, {}};
    const bool empty = parent.instances.empty();
    for (const discovery::MdevType& type : parent.types) {
      int existing = 0;
      for (const auto& instance : parent.instances) existing += instance.type_id == type.id;
      const int proven = std::min(type.available_instances + existing, kLargestMaximum);
      Learned& learned = record.types[type.id];
      if (empty) {
        // Nothing runs on the parent: what can be created is what it holds, exactly (this also
        // corrects a value learned under an older vendor driver).
        learned = {proven, true};
      } else if (proven > learned.value) {
        learned = {proven, false};
      }
      TypeMaximum max;
      if (type.stated_max_instances) {
        max = {std::min(std::max(*type.stated_max_instances, proven), kLargestMaximum),
               MaximumSource::kVendor};
      } else if (learned.seen_empty) {
        max = {learned.value, MaximumSource::kSeenEmpty};
      } else {
        max = {learned.value, MaximumSource::kAvailablePlusUsed};
      }
      current_[{parent.name, type.id}] = max;
    }
  }
  return learned_ != before;
}

TypeMaximum MdevTypeMaxima::Max(const std::string& parent, const std::string& type_id) const {
  auto it = current_.find({parent, type_id});
  return it == current_.end() ? TypeMaximum{} : it->second;
}

nlohmann::json MdevTypeMaxima::ToJson() const {
  nlohmann::json parents = nlohmann::json::object();
  for (const auto& [name, record] : learned_) {
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [type, learned] : record.types) {
      types[type] = {{"max", learned.value}, {"seenEmpty", learned.seen_empty}};
    }
    parents[name] = {{"model", record.model}, {"types", types}};
  }
  return {{"kind", "MdevTypeMaxima"}, {"version", kMdevTypeMaximaVersion}, {"parents", parents}};
}

Result<MdevTypeMaxima> MdevTypeMaxima::FromJson(const nlohmann::json& json,
                                                const std::string& where) {
  auto bad = [&](const std::string& what) {
    return MakeError(ErrorKind::kInvalidArgument, where + ": " + what);
  };
  if (!json.is_object() || json.value("kind", "") != "MdevTypeMaxima") {
    return bad("not an MdevTypeMaxima document");
  }
  if (!json.contains("version") || !json["version"].is_number_integer() ||
      json["version"].get<int>() != kMdevTypeMaximaVersion) {
    return bad("unknown version (this daemon reads version " +
               std::to_string(kMdevTypeMaximaVersion) + ")");
  }
  if (!json.contains("parents") || !json["parents"].is_object()) return bad("no parents object");
  MdevTypeMaxima out;
  for (const auto& [name, parent] : json["parents"].items()) {
    if (!parent.is_object() || !parent.contains("model") || !parent["model"].is_string() ||
        !parent.contains("types") || !parent["types"].is_object()) {
      return bad("parents." + name + ": expected {model, types}");
    }
    ParentRecord record;
    record.model = parent["model"].get<std::string>();
    for (const auto& [type, learned] : parent["types"].items()) {
      if (!learned.is_object() || !learned.contains("max") || !learned["max"].is_number_integer() ||
          !learned.contains("seenEmpty") || !learned["seenEmpty"].is_boolean()) {
        return bad("parents." + name + ".types." + type + ": expected {max, seenEmpty}");
      }
      const int64_t value = learned["max"].get<int64_t>();
      if (value < 0 || value > kLargestMaximum) {
        return bad("parents." + name + ".types." + type + ".max: " + std::to_string(value) +
                   " is out of range");
      }
      record.types[type] = {static_cast<int>(value), learned["seenEmpty"].get<bool>()};
    }
    out.learned_[name] = std::move(record);
  }
  return out;
}

Result<MdevTypeMaxima> MdevTypeMaxima::Load(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kNotFound) return MdevTypeMaxima{};
    return text.error().Wrap("reading the learned mdev type maxima");
  }
  auto json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return MakeError(ErrorKind::kInvalidArgument, path + ": not valid JSON");
  }
  return FromJson(json, path);
}

Status MdevTypeMaxima::Save(const std::string& path) const {
  return WriteFileAtomically(path, ToJson().dump(2) + "\n", 0644);
}

}  // namespace vfio_dra::slicepublisher
