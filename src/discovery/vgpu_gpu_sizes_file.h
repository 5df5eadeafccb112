// The file in the plugin data dir that keeps each GPU's whole frame buffer as its largest vGPU
// type showed it while the GPU was idle (VgpuGpuSize), so that the frame-buffer bound of a type
// (vgpu_selection.h) survives the GPU running that type, and a restart:
//
//   {"kind": "VgpuGpuSizes", "version": 1,
//    "gpus": {"0000:41:00.0": {"model": "10de:2331", "largestGB": 80,
//                              "largestType": "NVIDIA H100-80C",
//                              "types": {"1414": "NVIDIA H100-20C", ...}}}}
//
// It is a cache of what the driver showed, not a record of work done: losing it costs the bound
// of a GPU that runs a type until that GPU is idle again (it then offers nothing new), never a
// device. `serve` writes it; `discover` and `slices` only read it.
#pragma once

#include <string>

#include "base/result.h"
#include "discovery/device_selection.h"

namespace vfio_dra::discovery {

inline constexpr const char* kVgpuGpuSizesFile = "vgpu-gpu-sizes.json";

// A missing file is an empty memory; an unreadable or malformed one is an error naming it.
Result<VgpuGpuSizes> LoadVgpuGpuSizes(const std::string& path);
// A malformed file is moved aside to <path>.bad; the returned warning (empty: none) says so.
VgpuGpuSizes LoadVgpuGpuSizesOrMoveAside(const std::string& path, std::string& warning);
Status SaveVgpuGpuSizes(const std::string& path, const VgpuGpuSizes& sizes);

}  // namespace vfio_dra::discovery
