// DevicePlan: what preparing a claim means on this node, worked out before anything is touched.
// Each allocation result of this driver is looked up among the published devices and re-checked
// against sysfs now (the device still exists, with the vendor/device IDs and IOMMU group that
// were published), and its opaque config is decoded. A PCI device brings every non-bridge
// function of its IOMMU group (a GPU's audio and USB functions): VFIO hands out whole groups, and
// a group with a function left on a host driver cannot be opened.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "discovery/vfio_driver_choice.h"
#include "kube/resource_claim.h"
#include "prepare/prepare_checkpoint.h"
#include "prepare/vfio_config.h"
#include "slicepublisher/published_devices.h"
#include "sysfs/sysfs_reader.h"
#include "vfio/mdev_lifecycle.h"
#include "vfio/vf_network.h"

namespace vfio_dra::prepare {

// kVgpu: a vGPU on an NVIDIA vGPU VF; the VF is not rebound, its type is set.
enum class PlannedKind { kPci, kMdev, kVgpu };

struct PlannedDevice {
  kube::DeviceRequestAllocationResult result;
  slicepublisher::SliceDevice published;
  PlannedKind kind = PlannedKind::kPci;
  std::string address;                              // PCI and vGPU: the published function
  std::vector<std::string> functions;               // PCI: every function to bind, `address` first
  std::map<std::string, std::string> vfio_drivers;  // PCI: the VFIO driver of each function
  std::optional<int> iommu_group;       // PCI, vGPU: as published (none: unsafe no-IOMMU mode)
  int vgpu_type = 0;                    // vGPU: the type ID to set on the VF
  vfio::MdevIdentity mdev;              // mdev
  bool mdev_created_by_driver = false;  // mdev: one of the UUIDs vfio-dra creates
  VfioConfig config;
  // PCI: an SR-IOV VF of a network adapter, as its PF knows it. config.network is set on it before
  // binding (with the MAC the pod's KubeVirt annotation asks for, when it asks).
  std::optional<vfio::VfLink> vf_link;
  // The published attributes, as the KubeVirt metadata file carries them.
  std::map<std::string, nlohmann::json> attributes;
};

struct PlanContext {
  std::string driver;
  std::string node_name;
  const slicepublisher::PublishedDevices& published;
  const sysfs::SysfsReader& sysfs;
  // Why a PCI function cannot be touched now (an earlier operation on it is blocked in the
  // kernel); its attributes are not even read then, since the reads would block too. May be null.
  std::function<std::optional<std::string>(const std::string& address)> busy;
  // Picks each function's VFIO driver; null: vfio-pci for every function.
  const discovery::VfioDriverChooser* vfio_drivers = nullptr;
};

// The VFIO driver `device` binds `address` to.
std::string VfioDriverOf(const PlannedDevice& device, const std::string& address);

// Whether prepare makes the vGPU of `device` (a type offered on an idle VF) or hands out the one
// its VF held when published. Both have the same name; only an offered type consumes its VF's
// counter set (see AddVgpuVfs in slice_builder.cc). Asked only before the VF is recorded: from
// then on the claim's record says, since once the type is set the VF is published as holding it.
bool MakesVgpu(const PlannedDevice& device);

// One entry per result, in the order of `ours`; the first problem fails the whole claim.
Result<std::vector<PlannedDevice>> PlanClaim(
    const kube::ResourceClaim& claim, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    const PlanContext& context);

// The plan of a claim that was prepared before, rebuilt from its checkpoint record, so preparing
// it again (the kubelet's retry, a shared claim, a reboot) never depends on the device still being
// published. Fails when the claim's allocation is not the one that was prepared, and when a
// recorded IOMMU group is not the one `sysfs` shows now (groups renumbered since).
Result<std::vector<PlannedDevice>> PlanFromRecord(
    const ClaimRecord& record, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    const sysfs::SysfsReader& sysfs);

// What the checkpoint keeps of a planned device (no answer yet).
RecordedDevice RecordOf(const PlannedDevice& device);

// Where the VF at `address` is on its PF now: its physfn, and the PF's virtfn<N> that names it.
Result<vfio::VfLink> ReadVfLink(const sysfs::SysfsReader& sysfs, const std::string& address);

// Each network VF of `plan` with its VfLink as sysfs shows it now: a plan rebuilt from a record of
// an earlier boot has that boot's.
Status RelinkVfs(const sysfs::SysfsReader& sysfs, std::vector<PlannedDevice>& plan);

}  // namespace vfio_dra::prepare
