// The vGPU phase of device selection: what the NVIDIA vGPU VFs of each GPU (an SR-IOV PF) publish.
// Every GPU is in one of three states:
//  - a layout with create: ahead (vgpuLayouts): only the vGPUs that exist are published, each
//    once; its free VFs offer nothing (the layout's vGPUs are created by the layout applier);
//  - one type T created at prepare: a layout with create: onDemand, or the type the policy's vgpu
//    selectors pin for the GPU, or the type the GPU runs already. T is offered on free VFs only
//    with a bound N on how many vGPUs of T the GPU holds (the layout's count, else T's frame
//    buffer against the largest type's), and never on more free VFs than N minus the vGPUs of T
//    that exist, so whatever subset of the published devices the scheduler takes, the driver can
//    create it;
//  - neither: an idle GPU with several types and nothing chosen, or T without a bound: nothing
//    new is offered, and the GPU's `state` says why and how to fix it.
// A type the policy denies is neither offered nor published where it exists.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "discovery/admin_policy.h"
#include "discovery/device_selection.h"
#include "discovery/inventory.h"

namespace vfio_dra::discovery {

// `known` updated with what the idle GPUs of `inventory` show now.
VgpuGpuSizes ObserveVgpuGpuSizes(const Inventory& inventory, VgpuGpuSizes known);

// The frame buffer in GB that an NVIDIA vGPU type's name gives ("NVIDIA H100-20C": 20); nullopt
// for names of another form, such as MIG-backed types ("NVIDIA H100-1-10C").
std::optional<int> VgpuFrameBufferGb(const std::string& type_name);

// Fills selection.vgpu_vfs, selection.vgpu_gpus and the vGPU VFs' decisions; `sizes` gives the
// GPUs' whole frame buffers when a type runs (ObserveVgpuGpuSizes).
void SelectVgpus(const Inventory& inventory, const AdminPolicy& policy, const VgpuGpuSizes& sizes,
                 DeviceSelection& selection);

}  // namespace vfio_dra::discovery
