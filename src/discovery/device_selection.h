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
//  - a function without an IOMMU group is not managed unless the policy sets unsafeNoIommu.
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

struct DeviceSelection {
  std::vector<SelectedDevice> devices;  // sorted by address
  std::map<std::string, FunctionDecision> functions;
  std::vector<SelectedMdevType> mdev_types;
  std::vector<MdevTypeDecision> mdev_decisions;
};

// PCI vendors whose SR-IOV network VFs are published without a selector.
bool IsKnownNicVendor(uint32_t vendor_id);

DeviceSelection SelectDevices(const Inventory& inventory, const AdminPolicy& policy);

}  // namespace vfio_dra::discovery
