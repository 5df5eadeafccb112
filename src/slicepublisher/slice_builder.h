// BuildDesiredPool: the node's ResourceSlice content for one pool (pool name = node name), from a
// NodeScan. Pure: the same scan, options and maxima give the same slices, device names
// and mdev UUIDs.
//
// Partitionable parents (a GPU or another parent of mdev types) get one counter set each, with
// one counter, `capacity`; the numbers come from PlanMdevCounters (mdev_counters.h) on the maxima
// of MdevTypeMaxima. The whole-device entry and every instance of a parent are mutually exclusive
// for the scheduler, and a type is offered only as often as the kernel can still create it.
//
// A GPU with NVIDIA vGPU VFs that offers a type created at prepare gets one counter set
// (`vgpu-gpu-<PF>`) whose capacity is how many of that type it holds; every vGPU of the type on
// it, offered or existing, consumes 1. Other existing vGPUs are published without counters.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "discovery/node_scan.h"
#include "slicepublisher/device_taints.h"
#include "slicepublisher/mdev_type_maxima.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

inline constexpr const char* kCapacityCounter = "capacity";

struct BuildOptions {
  std::string node_name;
  CounterLayout layout = CounterLayout::kOwnSlice;
  // Taints (device_taints.h); null: none (the server does not take them).
  const TaintInputs* taints = nullptr;
  // 1.35+: a slice whose devices have taints or consume counters holds at most 64 devices.
  bool small_advanced_slices = true;
  // What is published now (null: nothing yet), with or without taints: a device a claim holds
  // keeps attributes from it that its function lacks while on vfio-pci.
  const PackedDeviceTable* published = nullptr;
};

DesiredPool BuildDesiredPool(const discovery::NodeScan& scan, const BuildOptions& options,
                             const MdevTypeMaxima& maxima);

// The part of `scan` that BuildDesiredPool and MdevTypeMaxima read: the selected devices and mdev
// types, the functions those devices and the mdev parents are, and the mdev parents. Building
// from it gives the same pool as building from the whole scan. Whoever keeps a scan to rebuild
// slices from later keeps this: on a node with thousands of functions, most of the inventory and
// the per-function decisions are not needed for that.
discovery::NodeScan BuilderInput(const discovery::NodeScan& scan);

// Limits the builder keeps to (the validator checks them again).
inline constexpr size_t kMaxDevicesPerSlice = 128;
inline constexpr size_t kMaxDevicesPerSliceWithCounters = 64;
inline constexpr size_t kMaxCounterSetsPerSlice = 8;      // 1.35+
inline constexpr size_t kMaxSharedCountersPerSlice = 32;  // 1.33/1.34: counters in all sets
inline constexpr size_t kMaxStringAttribute = 64;

}  // namespace vfio_dra::slicepublisher
