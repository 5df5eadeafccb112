// BuildDesiredPool: the node's ResourceSlice content for one pool (pool name = node name), from a
// NodeScan. Pure: the same scan, options and capacity memory give the same slices, device names
// and mdev UUIDs.
//
// The counter model (KEP-4815), per partitionable parent (a GPU or other parent of mdev types):
//  - max_t, the most instances type t can have on the parent, is what the kernel reported when
//    the type was free (available_instances plus existing instances of t), remembered across
//    scans because NVIDIA reports 0 for every other type once one type is in use;
//  - the parent's counter set holds one counter, `capacity`, of L = lcm(max_t) minus the shares of
//    instances that already exist; a potential instance of t consumes L / max_t; the whole-device
//    passthrough entry consumes L; instances that exist consume nothing (their share is already
//    gone from the capacity).
//  So the scheduler can never hand out the whole GPU together with any instance, nor more
//  instances than fit. Known limit: vendors that allow one type per parent at a time (NVIDIA
//  without heterogeneous vGPU) are modelled as if types could mix; the kernel refuses a second
//  type at prepare time (EUSERS / 0 available), which fails that claim with a clear error.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "discovery/node_scan.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

inline constexpr const char* kCapacityCounter = "capacity";

// The largest instance counts seen per (parent, type), kept by the publisher across scans.
class MdevCapacityMemory {
 public:
  void Observe(const discovery::Inventory& inventory);
  int MaxInstances(const std::string& parent, const std::string& type_id) const;

 private:
  std::map<std::pair<std::string, std::string>, int> max_;
};

struct BuildOptions {
  std::string node_name;
  CounterLayout layout = CounterLayout::kOwnSlice;
};

DesiredPool BuildDesiredPool(const discovery::NodeScan& scan, const BuildOptions& options,
                             const MdevCapacityMemory& capacity);

// Limits the builder keeps to (the validator checks them again).
inline constexpr size_t kMaxDevicesPerSlice = 128;
inline constexpr size_t kMaxDevicesPerSliceWithCounters = 64;
inline constexpr size_t kMaxCounterSetsPerSlice = 8;      // 1.35+
inline constexpr size_t kMaxSharedCountersPerSlice = 32;  // 1.33/1.34: counters in all sets
inline constexpr size_t kMaxStringAttribute = 64;

}  // namespace vfio_dra::slicepublisher
