// The contract of a published device. Attribute names are API: admins select on them in CEL and
// KubeVirt reads pciBusID and mdevUUID from the metadata they become, so renaming one breaks
// claims. The slice builder writes devices with these constants only, and everything that reads a
// published device back (the prepare plan, device health) decodes it once into a
// PublishedDeviceView instead of looking attributes up by literal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

namespace attribute {
// Standard names (resource.kubernetes.io/), understood by schedulers and other drivers.
inline constexpr char kPciBusId[] = "resource.kubernetes.io/pciBusID";
inline constexpr char kPcieRoot[] = "resource.kubernetes.io/pcieRoot";
inline constexpr char kNumaNode[] = "resource.kubernetes.io/numaNode";
// Driver-local names (qualified by the driver name in CEL: device.attributes["vfio.dra.io"]).
inline constexpr char kType[] = "type";          // a discovery::DeviceKindName
inline constexpr char kVendorId[] = "vendorID";  // 4 lower-case hex digits
inline constexpr char kDeviceId[] = "deviceID";
inline constexpr char kProductName[] = "productName";
inline constexpr char kIommuGroup[] = "iommuGroup";
inline constexpr char kHostDriver[] = "hostDriver";
// The VFIO driver prepare binds the device to: vfio-pci or a vendor variant (mlx5_vfio_pci, ...).
inline constexpr char kVfioDriver[] = "vfioDriver";
inline constexpr char kUnsafeNoIommu[] = "unsafeNoIommu";
inline constexpr char kPfPciAddress[] = "pfPciAddress";
inline constexpr char kVfIndex[] = "vfIndex";
inline constexpr char kNetdev[] = "netdev";
inline constexpr char kMdevUuid[] = "mdevUUID";
inline constexpr char kMdevType[] = "mdevType";
inline constexpr char kMdevParent[] = "mdevParent";
inline constexpr char kParentPciAddress[] = "parentPciAddress";
// NVIDIA vGPU on a VF: the type's ID as creatable_vgpu_types lists it (what prepare writes to
// current_vgpu_type) and its name.
inline constexpr char kVgpuTypeId[] = "vgpuTypeID";
inline constexpr char kVgpuTypeName[] = "vgpuTypeName";
// Not published (it is set at prepare): the MAC of a prepared network VF, in the KubeVirt
// metadata file.
inline constexpr char kMacAddress[] = "macAddress";
}  // namespace attribute

// The value of attribute::kType for mediated devices.
inline constexpr char kMdevDeviceType[] = "mdev";
// The value of attribute::kType for vGPUs on NVIDIA vGPU VFs (DeviceKindName(kVgpu)).
inline constexpr char kVgpuDeviceType[] = "vgpu";

// A published device as its readers need it. Fields are empty when the attribute is absent or
// not of its type (a device of another kind, or a slice written by an older version).
struct PublishedDeviceView {
  std::string name;
  std::string type;
  std::optional<std::string> pci_bus_id;  // PCI devices: the function handed out
  std::optional<uint32_t> vendor_id;      // of the function, or of an mdev's parent
  std::optional<uint32_t> device_id;
  std::optional<int64_t> iommu_group;
  std::optional<std::string> mdev_uuid;  // mediated devices
  std::optional<std::string> mdev_type;
  std::optional<std::string> mdev_parent;
  std::optional<std::string> parent_pci_address;
  std::optional<int64_t> vgpu_type_id;  // vGPUs on NVIDIA vGPU VFs

  bool IsMdev() const { return type == kMdevDeviceType; }
  bool IsVgpu() const { return type == kVgpuDeviceType; }
};

PublishedDeviceView DecodePublishedDevice(const SliceDevice& device);

// Reads one attribute; nullopt when absent or of another type.
std::optional<std::string> StringAttribute(const SliceDevice& device, const std::string& name);
std::optional<int64_t> IntAttribute(const SliceDevice& device, const std::string& name);

}  // namespace vfio_dra::slicepublisher
