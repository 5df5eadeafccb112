#include "slicepublisher/device_attributes.h"

#include "sysfs/sysfs_parse.h"

namespace vfio_dra::slicepublisher {
namespace {

std::optional<uint32_t> HexAttribute(const SliceDevice& device, const std::string& name) {
  auto text = StringAttribute(device, name);
  if (!text) return std::nullopt;
  auto value = sysfs::ParseBareHex(*text, 4);
  if (!value.ok()) return std::nullopt;
  return *value;
}

}  // namespace

PublishedDeviceView DecodePublishedDevice(const SliceDevice& device) {
  PublishedDeviceView view;
  view.name = device.name;
  view.type = StringAttribute(device, attribute::kType).value_or("");
  view.pci_bus_id = StringAttribute(device, attribute::kPciBusId);
  view.vendor_id = HexAttribute(device, attribute::kVendorId);
  view.device_id = HexAttribute(device, attribute::kDeviceId);
  view.iommu_group = IntAttribute(device, attribute::kIommuGroup);
  view.mdev_uuid = StringAttribute(device, attribute::kMdevUuid);
  view.mdev_type = StringAttribute(device, attribute::kMdevType);
  view.mdev_parent = StringAttribute(device, attribute::kMdevParent);
  view.parent_pci_address = StringAttribute(device, attribute::kParentPciAddress);
  view.vgpu_type_id = IntAttribute(device, attribute::kVgpuTypeId);
  return view;
}

std::optional<std::string> StringAttribute(const SliceDevice& device, const std::string& name) {
  auto it = device.attributes.find(name);
  if (it == device.attributes.end()) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return std::nullopt;
}

std::optional<int64_t> IntAttribute(const SliceDevice& device, const std::string& name) {
  auto it = device.attributes.find(name);
  if (it == device.attributes.end()) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  return std::nullopt;
}

}  // namespace vfio_dra::slicepublisher
