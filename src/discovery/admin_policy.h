// AdminPolicy: the node admin's say over what vfio-dra may hand out (--config, YAML). Selectors
// opt devices in per kind, a deny list keeps devices out, and each kind can be turned off. The
// safety rules of DeviceSelection hold whatever the policy says, except that devices without an
// IOMMU group can be allowed by the explicitly unsafe `unsafeNoIommu` switch.
//
//   version: v1
//   kinds: {gpu: true, mdev: true, vf: true, hostdev: true, vgpu: true}
//   select:
//     - kind: hostdev          # gpu | mdev | vf | hostdev | vgpu (required)
//       vendor: "8086"         # each field: one value or a list; all given fields must match
//       device: ["1572", "1583"]
//       class: "0200"          # base class + subclass (4 hex digits) or full class (6)
//       address: "0000:5e:00.0"
//       pf: "0000:5e:00.0"     # vf and vgpu only: the VF's physical function
//       driver: "i40e"
//       mdevType: "nvidia-222" # mdev only
//       vgpuType: "1414"       # vgpu only: a type ID or name as creatable_vgpu_types lists it
//   deny:
//     - address: "0000:00:1f.6"
//   vfioDrivers:               # which VFIO driver prepare binds a function to; first match wins
//     - match: {vendor: "15b3", device: "101e"}   # selector fields, no kind needed
//       use: vfio-pci          # a driver or module name; without a rule modules.alias decides
//   vgpuLayouts:               # NVIDIA vGPU on SR-IOV VFs: the one type a GPU runs, and how many
//     - match: {address: "0000:41:00.0"}  # the GPU (PF): address, vendor, device, driver, class
//       vgpuType: "1415"       # an ID or a name as creatable_vgpu_types lists it
//       count: 2               # a number, or max: as many as the GPU holds
//       create: ahead          # ahead (default): vfio-dra creates them while the GPU is idle and
//                              # publishes each as a device of its own; onDemand: prepare creates
//                              # them, and a counter set per GPU admits at most `count`
//   unsafeNoIommu: false
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "discovery/inventory.h"

namespace vfio_dra::discovery {

// kVgpu: an NVIDIA vGPU on an SR-IOV VF (no mdev), one type per VF.
enum class DeviceKind { kGpu, kMdev, kVf, kHostdev, kVgpu };
const char* DeviceKindName(DeviceKind kind);

struct DeviceSelector {
  std::optional<DeviceKind> kind;  // required in `select`, optional in `deny`
  std::set<uint32_t> vendors;
  std::set<uint32_t> devices;
  std::set<uint32_t> classes;  // class+subclass (16 bits), or a full 24-bit class | 0x1000000
  std::set<std::string> addresses;
  std::set<std::string> pfs;
  std::set<std::string> drivers;
  std::set<std::string> mdev_types;
  std::set<std::string> vgpu_types;  // IDs or names
  std::string where;                 // "select[2]" for messages

  // Whether `fn` matches every given field (mdevType must be unset, or the call must be for a
  // type: MatchesMdev).
  bool MatchesFunction(const PciFunction& fn) const;
  // For mdev types: the type and, where the parent is a PCI function, the parent's fields.
  bool MatchesMdev(const std::string& type_id, const PciFunction* parent) const;
  // For a vGPU type of an NVIDIA vGPU VF: the type (by ID or name) and the VF's fields.
  bool MatchesVgpu(const sysfs::CreatableVgpuType& type, const PciFunction& vf) const;

 private:
  // Every given field but the type ones matches `fn`.
  bool MatchesPciFields(const PciFunction& fn) const;
};

// The admin's choice of VFIO driver for the functions `match` selects, over what the kernel's
// module aliases would pick.
struct VfioDriverRule {
  DeviceSelector match;
  std::string use;
};

// How the vGPUs of a layout come to exist.
enum class VgpuCreation {
  kAhead,     // vfio-dra creates them while the GPU holds none; only what exists is offered
  kOnDemand,  // prepare creates one per claim; the GPU's counter set bounds how many
};

// The admin's declared vGPU layout of the GPUs (SR-IOV PFs) `match` selects: the one type they
// run and how many of it. Layouts are what keeps the scheduler from allocating vGPUs the GPU
// cannot create: the driver's lists say what a VF can take now, never how many the GPU holds.
struct VgpuLayout {
  DeviceSelector match;      // matched against the PF; no kind, pf, mdevType or vgpuType
  std::string vgpu_type;     // an ID or a name, as creatable_vgpu_types lists it
  std::optional<int> count;  // unset: as many as the GPU holds
  VgpuCreation create = VgpuCreation::kAhead;
  std::string where;  // "vgpuLayouts[1]" for messages

  bool MatchesType(const sysfs::CreatableVgpuType& type) const;
};

struct AdminPolicy {
  bool gpu_enabled = true;
  bool mdev_enabled = true;
  bool vf_enabled = true;
  bool hostdev_enabled = true;
  bool vgpu_enabled = true;
  bool unsafe_no_iommu = false;
  std::vector<DeviceSelector> select;
  std::vector<DeviceSelector> deny;
  std::vector<VfioDriverRule> vfio_drivers;
  std::vector<VgpuLayout> vgpu_layouts;
  std::string source = "built-in default policy";

  bool KindEnabled(DeviceKind kind) const;
  bool HasSelectorsFor(DeviceKind kind) const;
  // The first layout whose match selects the GPU `pf` (nullptr: none declared).
  const VgpuLayout* VgpuLayoutFor(const PciFunction& pf) const;
};

// Parses policy YAML; errors read "<path>:<line>: <key>: <problem>".
Result<AdminPolicy> ParseAdminPolicy(const std::string& yaml_text, const std::string& path);
Result<AdminPolicy> LoadAdminPolicy(const std::string& path);

}  // namespace vfio_dra::discovery
