// Inventory: what the node has, as read from sysfs at one moment. Plain values only; policy and
// publishing decisions are made elsewhere (DeviceSelection). Invariants: every PCI address is
// canonical lower-case "dddd:bb:dd.f"; IOMMU groups are built from the functions' own
// iommu_group links, so membership is symmetric; functions that could not be read are absent
// from `functions`, named in `warnings`, and still recorded in their group when the group link
// was readable. Non-PCI members of IOMMU groups are not tracked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sysfs/sysfs_parse.h"

namespace vfio_dra::discovery {

struct SriovPf {
  int total_vfs = 0;
  int num_vfs = 0;
  std::vector<std::string> vfs;  // by VF index
};

struct SriovVf {
  std::string pf;  // PF address
  int index = -1;  // N of the PF's virtfnN link
};

// The VFIO driver prepare binds a function to: a vendor variant driver where the kernel's module
// aliases (or the admin policy) name one, plain vfio-pci otherwise.
struct VfioDriverChoice {
  enum class Source { kDefault, kModuleAlias, kPolicy };
  std::string driver = "vfio-pci";  // its name under /sys/bus/pci/drivers
  std::string module;               // the module an alias named ("" otherwise)
  Source source = Source::kDefault;
  bool loaded = true;  // false: the driver is not registered now, so a bind would fail
  std::string why;     // for reports: the alias module or the policy rule
  bool operator==(const VfioDriverChoice&) const = default;
};

// The vGPU side of an SR-IOV VF of an NVIDIA GPU that runs vGPUs on VFs without mdev (Ada,
// Hopper, Blackwell; vGPU 17+): the files under the VF's nvidia/ directory. The driver re-lists
// what each VF can take after every change on its PF, so these are read on every scan.
struct VgpuVf {
  int current_type = 0;  // nvidia/current_vgpu_type: the vGPU it holds, 0 for none
  std::vector<sysfs::CreatableVgpuType> creatable;  // nvidia/creatable_vgpu_types now
  bool operator==(const VgpuVf&) const = default;
};

struct PciFunction {
  std::string address;
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  uint32_t subsystem_vendor_id = 0;
  uint32_t subsystem_device_id = 0;
  uint32_t class_code = 0;  // 24 bits: base class, subclass, programming interface
  uint32_t revision = 0;
  std::string vendor_name;  // from pci.ids; empty when unknown
  std::string device_name;
  // The bound driver, empty when none. For a function vfio-dra has bound to vfio-pci for a
  // claim, the driver it had before (selectors and safety rules judge it by what it was, so it
  // neither drops out of the slices nor blocks its own IOMMU group while prepared).
  std::string driver;
  bool bound_by_vfio_dra = false;  // `driver` is the original one; vfio-pci holds it now
  std::string driver_override;     // empty when unset
  std::optional<int> iommu_group;
  std::optional<int> numa_node;  // absent when the kernel reports -1 or nothing
  std::string pcie_root;         // "pci0000:00", from the device's real path
  std::optional<SriovPf> sriov_pf;
  std::optional<SriovVf> sriov_vf;
  std::vector<std::string> netdevs;
  std::optional<VgpuVf> vgpu_vf;  // a VF with nvidia/current_vgpu_type
  // Health signals, read on every scan (device_conditions.h turns them into taints). Fatal PCIe
  // errors the AER driver counted since the function appeared (aer_dev_fatal); absent when the
  // function reports no AER. A function re-created by remove and rescan (or a reset that
  // re-enumerates it) starts again at 0, which is how a fatal error's taint clears.
  std::optional<int64_t> aer_fatal_errors;
  std::string aer_unreadable;  // aer_dev_fatal exists but could not be read: why
  bool link_down = false;      // an SR-IOV PF whose network interfaces all report link down
  // A function a prepared claim holds, found on a driver that is neither the VFIO driver prepare
  // bound it to nor the one it had before (ScanNode sets it; the scan alone cannot know).
  std::string foreign_driver;
  std::string modalias;  // "pci:v...d...sv...sd...bc..sc..i..", as the kernel writes it
  VfioDriverChoice vfio_driver;

  uint32_t BaseClass() const { return class_code >> 16; }
  uint32_t ClassAndSubclass() const { return class_code >> 8; }  // e.g. 0x0300
  bool IsBridge() const { return BaseClass() == 0x06; }
  // "dddd:bb:dd" without the function number: functions of one physical slot.
  std::string Slot() const { return address.substr(0, address.size() - 2); }
};

struct IommuGroup {
  int id = 0;
  std::vector<std::string> members;  // PCI addresses, sorted
  // Members whose sysfs entry could not be read: nothing is known about them, so the group
  // must be treated as in use.
  std::vector<std::string> unreadable_members;
};

struct MdevType {
  std::string id;  // e.g. "nvidia-222"
  std::string name;
  std::string description;
  std::string device_api;
  int available_instances = 0;
  // What the vendor states the parent holds of this type when empty (NVIDIA: `max_instance=N`
  // in the description); absent when the vendor says nothing.
  std::optional<int> stated_max_instances;
};

struct MdevInstance {
  std::string uuid;
  std::string type_id;
  std::optional<int> iommu_group;
};

struct MdevParent {
  std::string name;         // entry name under class/mdev_bus (a PCI address for PCI parents)
  std::string pci_address;  // empty when the parent is not a PCI device
  std::vector<MdevType> types;
  std::vector<MdevInstance> instances;
};

struct Inventory {
  std::map<std::string, PciFunction> functions;  // by address
  std::map<int, IommuGroup> iommu_groups;
  std::vector<MdevParent> mdev_parents;  // sorted by name
  bool iommu_enabled = false;            // kernel/iommu_groups has entries
  // Every function the bus lists, readable or not, sorted: whether a function is still there
  // when `functions` holds only part of the node (slice_builder.h's BuilderInput). A function
  // that left the bus while the scan read it is not listed.
  std::vector<std::string> listed;
  std::vector<std::string> warnings;  // one per entry that was skipped

  bool Listed(const std::string& address) const {
    return std::binary_search(listed.begin(), listed.end(), address);
  }
  const PciFunction* Find(const std::string& address) const {
    auto it = functions.find(address);
    return it == functions.end() ? nullptr : &it->second;
  }
};

}  // namespace vfio_dra::discovery
