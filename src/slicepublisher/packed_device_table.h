// PackedDeviceTable: the published devices as the daemon keeps them between publishes, packed
// into one buffer. Kept as SliceDevices (a map node and a string per attribute), 1,000 devices
// held over a MiB of small allocations for the life of the daemon, scattered among the pages of a
// publish's short-lived data; packed, they are a few hundred bytes each in one allocation.
//
// Invariants: immutable once built; devices are unique by name (of several devices of one name,
// the last given wins, as assigning them to a map in turn would) and sorted by it; Find and
// ForEach hand out devices equal to the ones packed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

class PackedDeviceTable {
 public:
  PackedDeviceTable() = default;
  explicit PackedDeviceTable(const std::vector<const SliceDevice*>& devices);

  size_t size() const { return starts_.size(); }
  bool empty() const { return starts_.empty(); }
  std::optional<SliceDevice> Find(std::string_view name) const;
  // Every device in name order, unpacked one at a time.
  void ForEach(const std::function<void(const SliceDevice&)>& each) const;
  bool operator==(const PackedDeviceTable&) const = default;

 private:
  std::string_view NameAt(uint32_t start) const;
  SliceDevice UnpackAt(uint32_t start) const;

  std::string bytes_;
  std::vector<uint32_t> starts_;  // where each device begins in bytes_, in name order
};

}  // namespace vfio_dra::slicepublisher
