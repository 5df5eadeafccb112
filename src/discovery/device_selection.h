// DeviceSelection: which of the node's devices vfio-dra publishes, as what, and, for every one it
// does not, why. The safety rules here hold under any policy:
//  - bridges, SR-IOV PFs with VFs enabled, and devices behind a VMD controller (domains beyond
//    16 bits) are never managed;
//  - a device is bound together with the other endpoints of its IOMMU group, so a device whose
//    group holds an endpoint that a host driver uses and that vfio-dra does not manage is refused
//    (binding it would take that endpoint away from the host, or the group would not be viable);
//  - a GPU's companion functions (HDA audio, USB, UCSI on the same slot and group) belong to the
//    GPU and are not published on their own;
//  - when several selected endpoints share one group, the group is one device: the lowest address
//    is published and the others are bound with it;
//  - a function without an IOMMU group is not managed unless the policy sets unsafeNoIommu;
//  - an NVIDIA vGPU VF (nvidia/current_vgpu_type) is never bound to a VFIO driver: it stays on
//    nvidia, its VFIO provider, and is published only as vGPUs (kind vgpu), one type per VF; a VF
//    that holds a vGPU is published as that vGPU and offered nothing else;
//  - a GPU with vGPU VFs offers new vGPUs (created at prepare) of one type only, and only with a
//    bound on how many of it the GPU holds (vgpu_selection.h); otherwise only what exists.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "discovery/admin_policy.h"
#include "discovery/inventory.h"

namespace vfio_dra::discovery {

// A PCI device to publish: one function plus the functions bound with it.
struct SelectedDevice {
  DeviceKind kind = DeviceKind::kHostdev;
  std::string address;
  std::vector<std::string> companions;  // bound to vfio-pci together with `address`
  bool unsafe_no_iommu = false;
};

struct FunctionDecision {
  std::optional<DeviceKind> kind;  // what the function would be published as
  bool published = false;
  std::string reason;  // why not published (or a note such as the companion's owner)
  // Refused only because its IOMMU group holds a function the host uses (or one unreadable).
  bool group_unsafe = false;
};

struct SelectedMdevType {
  std::string parent;  // MdevParent::name
  std::string type_id;
};

struct MdevTypeDecision {
  std::string parent;
  std::string type_id;
  bool published = false;
  std::string reason;
};

// An NVIDIA vGPU VF to publish: the vGPU it holds, or the one type prepare may create on it.
struct SelectedVgpuVf {
  std::string address;
  int current_type = 0;      // non-zero: the VF holds this vGPU, published as it is
  std::string current_name;  // the type's name when a sibling's list names it
  std::vector<sysfs::CreatableVgpuType> offered;  // when it holds none: its GPU's offered type
};

// One GPU (an SR-IOV PF) with NVIDIA vGPU VFs: the type its free VFs offer, to be created at
// prepare, and how many vGPUs of that type the GPU holds (the capacity of its counter set, which
// every vGPU of the type on the GPU consumes 1 of, offered or existing).
struct SelectedVgpuGpu {
  std::string pf;
  int type_id = 0;  // 0: nothing new offered; only the vGPUs that exist are published
  std::string type_name;
  int bound = 0;             // > 0 whenever type_id is set
  std::string bound_source;  // where `bound` comes from, in words
  std::string state;         // the GPU's state and, when it offers nothing new, why and the fix
};

// A GPU's whole frame buffer as its largest vGPU type gives it. The largest type is listed only
// while the GPU is idle (once a type runs, the VFs list only that type), so what an idle scan
// showed is kept per PF, with the PF's model (vendor:device): a PF that is now another card
// starts afresh. The daemon keeps these in a file (vgpu_gpu_sizes_file.h).
struct VgpuGpuSize {
  std::string model;  // "10de:2331"
  int largest_gb = 0;
  std::string largest_name;
  // Every type the idle GPU listed, by ID: a full GPU lists none, not even the one it runs.
  std::map<int, std::string> types;
  bool operator==(const VgpuGpuSize&) const = default;
};
using VgpuGpuSizes = std::map<std::string, VgpuGpuSize>;  // by PF address

struct DeviceSelection {
  std::vector<SelectedDevice> devices;  // sorted by address
  std::map<std::string, FunctionDecision> functions;
  std::vector<SelectedMdevType> mdev_types;
  std::vector<MdevTypeDecision> mdev_decisions;
  std::vector<SelectedVgpuVf> vgpu_vfs;    // sorted by address
  std::vector<SelectedVgpuGpu> vgpu_gpus;  // sorted by PF
};

// PCI vendors whose SR-IOV network VFs are published without a selector.
bool IsKnownNicVendor(uint32_t vendor_id);

// `vgpu_sizes`: the GPUs' whole frame buffers seen while they were idle.
DeviceSelection SelectDevices(const Inventory& inventory, const AdminPolicy& policy,
                              const VgpuGpuSizes& vgpu_sizes = {});

}  // namespace vfio_dra::discovery
