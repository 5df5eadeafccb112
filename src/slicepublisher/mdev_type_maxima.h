// MdevTypeMaxima: how many instances of each mdev type a parent holds when nothing else runs on
// it (max_t), the number the counter model (mdev_counters.h) is built on. The kernel only reports
// what can still be created, so once instances exist max_t has to come from somewhere else, in
// this order:
//  1. the vendor's own statement (NVIDIA's `max_instance=N` in the type's description);
//  2. what this node's parent showed when it held no instance: then available_instances is the
//     maximum, exactly. Such values are learned from every scan and kept in a small file in the
//     plugin data dir, so a restarted daemon (or the next instance of a rolling update) starts
//     from what the one that created the instances saw;
//  3. only then available_instances + the existing instances of that type, a lower bound.
// A value is never below what the kernel proves now (available + existing of that type).
//
// Learned values are tied to the parent's model (PCI vendor:device); a parent that now is another
// device starts afresh. The file is a cache of what the kernel showed, not a record of work done:
// losing it costs accuracy until the parent is empty again, never a device.
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>

#include "base/result.h"
#include "discovery/inventory.h"

namespace vfio_dra::slicepublisher {

inline constexpr int kMdevTypeMaximaVersion = 1;
inline constexpr const char* kMdevTypeMaximaFile = "mdev-type-maxima.json";

enum class MaximumSource {
  kNone,               // the type was never seen
  kVendor,             // 1. stated by the vendor driver
  kSeenEmpty,          // 2. available_instances while the parent held no instance
  kAvailablePlusUsed,  // 3. a lower bound only
};
const char* MaximumSourceName(MaximumSource source);

struct TypeMaximum {
  int value = 0;
  MaximumSource source = MaximumSource::kNone;
  // Whether value is the parent's real maximum rather than a lower bound.
  bool Exact() const {
    return source == MaximumSource::kVendor || source == MaximumSource::kSeenEmpty;
  }
};

class MdevTypeMaxima {
 public:
  // Takes in what the kernel shows now. Returns whether a learned value changed (the caller then
  // saves the file).
  bool Observe(const discovery::Inventory& inventory);
  // The maximum of a type as of the last Observe; value 0 for a type never seen.
  TypeMaximum Max(const std::string& parent, const std::string& type_id) const;

  nlohmann::json ToJson() const;
  // `where` names the source in errors.
  static Result<MdevTypeMaxima> FromJson(const nlohmann::json& json, const std::string& where);
  // A missing file is an empty memory; an unreadable or malformed one is an error naming it.
  static Result<MdevTypeMaxima> Load(const std::string& path);
  Status Save(const std::string& path) const;

 private:
  struct Learned {
    int value = 0;
    bool seen_empty = false;
    bool operator==(const Learned&) const = default;
  };
  struct ParentRecord {
    std::string model;  // "vvvv:dddd" of a PCI parent, empty for others (mtty)
    std::map<std::string, Learned> types;
    bool operator==(const ParentRecord&) const = default;
  };
  std::map<std::string, ParentRecord> learned_;  // by parent name; what the file holds
  std::map<std::pair<std::string, std::string>, TypeMaximum> current_;
};

}  // namespace vfio_dra::slicepublisher
