// Applying a recorded prepare decision to the node: each function bound to its VFIO driver (after
// its VF's network settings), each mdev created, each vGPU type set; then the claim's CDI spec,
// the KubeVirt metadata files and, in the background, the network VFs' claim status. Every step
// is idempotent: a retry re-creates what is missing and leaves what is in place.
#include <algorithm>
#include <limits>

#include "base/k8s_names.h"
#include "base/text.h"
#include "prepare/vfio_device_preparer.h"
#include "slicepublisher/device_attributes.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {
namespace {

cdi::DeviceNode CdiNode(const vfio::CharDeviceNode& node) {
  return cdi::DeviceNode{node.path, "", node.major, node.minor};
}

}  // namespace

Result<std::vector<PreparedDevice>> VfioDevicePreparer::Apply(
    const kube::ResourceClaim& claim, std::vector<PlannedDevice>& plan, const ClaimRecord& record,
    std::map<std::string, std::string>& macs, Deadline deadline) {
  for (const PlannedDevice& device : plan) {
    if (Status s = ApplyDevice(device, record, macs, deadline); !s.ok()) return s.error();
  }

  cdi::Spec spec;
  spec.kind = kind_;
  bool needs_container = false;
  std::vector<PreparedDevice> answer;
  for (const PlannedDevice& device : plan) {
    auto cdi_device = CdiDevice(claim.uid, device, needs_container);
    if (!cdi_device.ok()) return cdi_device.error();
    PreparedDevice prepared;
    prepared.request_names = {kube::BaseRequestName(device.result.request)};
    prepared.pool_name = device.result.pool;
    prepared.device_name = device.result.device;
    prepared.share_id = device.result.share_id;
    prepared.cdi_device_ids = {cdi::QualifiedDeviceId(kind_, cdi_device->name)};
    spec.devices.push_back(std::move(*cdi_device));
    answer.push_back(std::move(prepared));
  }
  if (needs_container) {
    auto container = nodes_.Container();
    if (!container.ok()) return container.error();
    spec.common_device_nodes.push_back(CdiNode(*container));
  }
  Step("cdi:write");
  if (Status s = cdi_.Write(SpecFileName(claim.uid), spec); !s.ok()) return s.error();
  if (Status s = WriteMetadata(claim, plan, macs, answer); !s.ok()) return s.error();
  return answer;
}

Status VfioDevicePreparer::ApplyDevice(const PlannedDevice& device, const ClaimRecord& record,
                                       std::map<std::string, std::string>& macs,
                                       Deadline deadline) {
  const auto out_of_time = [](const std::string& what) {
    return MakeError(ErrorKind::kDeadlineExceeded,
                     "stopped before " + what +
                         ": the kubelet's deadline for this call is reached; its retry continues "
                         "from here");
  };
  if (device.kind == PlannedKind::kVgpu) {
    const VgpuRecord* recorded = FindVgpu(record, device.address);
    if (recorded == nullptr || recorded->type_id != device.vgpu_type) {
      // A record of another allocation of this claim: what it set is undone by unprepare.
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + device.result.device +
                           ": the claim's checkpoint record holds VF " + device.address +
                           " without vGPU type " + std::to_string(device.vgpu_type) +
                           "; the claim must be unprepared before it is prepared with this type");
    }
    if (!recorded->created_by_us) {
      Status held = vgpus_.CheckHolds(device.address, device.vgpu_type);
      if (!held.ok()) return held.error().Wrap("device " + device.result.device);
      return Status::Ok();
    }
    if (deadline.Expired()) return out_of_time("setting vGPU type on " + device.address);
    Step("vgpu-create:" + device.address);
    // The record, written before this write, says this claim sets the type: a VF that holds it
    // already is this claim's earlier attempt (killed after the write; a power loss would have
    // cleared the type).
    auto created = Timed("vgpu_create", [&] {
      return vgpus_.Assign(device.address, device.vgpu_type, vfio::VgpuVfLifecycle::Held::kOurs,
                           deadline);
    });
    if (!created.ok()) return created.error().Wrap("device " + device.result.device);
    return Status::Ok();
  }
  if (device.kind == PlannedKind::kMdev) {
    if (!device.mdev_created_by_driver) return Status::Ok();
    if (deadline.Expired()) return out_of_time("creating mdev " + device.mdev.uuid);
    Step("mdev-create:" + device.mdev.uuid);
    auto created = Timed("mdev_create", [&] { return mdevs_.Create(device.mdev); });
    if (!created.ok()) return created.error().Wrap("device " + device.result.device);
    return Status::Ok();
  }
  if (device.vf_link) {
    // Before binding: the PF's driver may reset the VF to apply a MAC, which its VFIO user would
    // see as a device reset.
    if (deadline.Expired()) return out_of_time("configuring " + device.vf_link->Display());
    Step("vf-config:" + device.address);
    auto mac = Timed("vf_config", [&] { return vf_network_.Configure(device); });
    if (!mac.ok()) return mac.error();
    if (*mac) macs[device.result.device] = **mac;
  }
  for (const std::string& address : device.functions) {
    if (deadline.Expired()) return out_of_time("binding " + address);
    Step("bind:" + address);
    if (Status s = Timed(
            "bind",
            [&] { return binder_.BindToVfio(address, VfioDriverOf(device, address), deadline); });
        !s.ok()) {
      return s.error().Wrap("device " + device.result.device);
    }
  }
  return Status::Ok();
}

Result<cdi::Device> VfioDevicePreparer::CdiDevice(const std::string& claim_uid,
                                                  const PlannedDevice& device,
                                                  bool& needs_container) {
  cdi::Device out;
  out.name = claim_uid + "-" + device.result.device;
  const IommuInterface iommu = device.config.iommu;
  const bool legacy = iommu != IommuInterface::kIommufd;
  std::optional<int> group = device.iommu_group;
  std::string sysfs_dir = "bus/pci/devices/" + device.address;
  if (device.kind == PlannedKind::kMdev) {
    auto mdev_group = mdevs_.IommuGroup(device.mdev.uuid);
    if (!mdev_group.ok()) return mdev_group.error();
    group = *mdev_group;
    sysfs_dir = "bus/mdev/devices/" + device.mdev.uuid;
  } else if (device.kind == PlannedKind::kVgpu) {
    // The VF's own group (nvidia.ko registers it with VFIO); planned only with one.
  } else if (!group) {
    // No-IOMMU mode: the kernel makes a group when vfio-pci binds the device.
    auto bound = sysfs_.LinkBaseName(sysfs_dir + "/iommu_group");
    if (!bound.ok()) return bound.error().Wrap("device " + device.address + " has no VFIO group");
    auto number = sysfs::ParseDecimalAttribute(*bound);
    if (!number.ok() || *number < 0 || *number > std::numeric_limits<int>::max()) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + device.address + ": its iommu_group link points to \"" +
                           EscapeForDisplay(*bound, 64) + "\", which is not a group number");
    }
    group = static_cast<int>(*number);
  }
  if (legacy) {
    needs_container = true;
    auto node = nodes_.Group(*group);
    if (!node.ok()) return node.error().Wrap("device " + device.result.device);
    out.device_nodes.push_back(CdiNode(*node));
  }
  if (iommu != IommuInterface::kLegacy) {
    auto iommufd = nodes_.Iommufd();
    if (!iommufd.ok()) {
      if (iommu == IommuInterface::kIommufd) {
        return iommufd.error().Wrap("device " + device.result.device +
                                    ": VfioConfig asks for iommuInterface iommufd");
      }
    } else {
      out.device_nodes.push_back(CdiNode(*iommufd));
      std::vector<std::string> dirs;
      if (device.kind != PlannedKind::kPci) {
        dirs.push_back(sysfs_dir);
      } else {
        for (const std::string& f : device.functions) dirs.push_back("bus/pci/devices/" + f);
      }
      for (const std::string& dir : dirs) {
        auto cdevs = nodes_.DeviceCdevs(dir);
        if (!cdevs.ok()) return cdevs.error().Wrap("device " + device.result.device);
        if (cdevs->empty() && iommu == IommuInterface::kIommufd) {
          return MakeError(ErrorKind::kFailedPrecondition,
                           "device " + device.result.device + ": " + sysfs_.Path(dir) +
                               " has no vfio-dev cdev (the kernel lacks "
                               "CONFIG_VFIO_DEVICE_CDEV); use iommuInterface legacy or both");
        }
        for (const auto& cdev : *cdevs) out.device_nodes.push_back(CdiNode(cdev));
      }
    }
  }
  return out;
}

Status VfioDevicePreparer::WriteMetadata(const kube::ResourceClaim& claim,
                                         const std::vector<PlannedDevice>& plan,
                                         const std::map<std::string, std::string>& macs,
                                         std::vector<PreparedDevice>& answer) {
  std::vector<std::string> requests;
  for (const PlannedDevice& device : plan) {
    const std::string request = kube::BaseRequestName(device.result.request);
    if (std::ranges::find(requests, request) == requests.end()) requests.push_back(request);
  }
  for (const std::string& request : requests) {
    cdi::RequestMetadata metadata;
    metadata.claim_namespace = claim.namespace_;
    metadata.claim_name = claim.name;
    metadata.claim_uid = claim.uid;
    metadata.request = request;
    metadata.generation = claim.generation;
    if (auto it = claim.annotations.find(kube::kPodClaimNameAnnotation);
        it != claim.annotations.end()) {
      metadata.pod_claim_name = it->second;
    }
    for (const PlannedDevice& device : plan) {
      if (kube::BaseRequestName(device.result.request) != request) continue;
      cdi::MetadataDevice entry{options_.driver_name, device.result.pool, device.result.device,
                                device.attributes};
      if (auto mac = macs.find(device.result.device); mac != macs.end()) {
        entry.attributes[slicepublisher::attribute::kMacAddress] = {{"string", mac->second}};
      }
      metadata.devices.push_back(std::move(entry));
    }
    Step("metadata:write:" + request);
    auto id = metadata_.Write(metadata);
    if (!id.ok()) return id.error();
    for (PreparedDevice& prepared : answer) {
      if (prepared.request_names.front() == request) {
        prepared.cdi_device_ids.push_back(*id);
        break;
      }
    }
  }
  return Status::Ok();
}

void VfioDevicePreparer::WriteClaimStatus(const kube::ResourceClaim& claim,
                                          const std::vector<PlannedDevice>& plan,
                                          const std::map<std::string, std::string>& macs) {
  if (options_.claim_status == nullptr) return;
  auto devices = VfNetworkConfigurator::StatusOf(options_.driver_name, claim, plan, macs);
  if (devices.empty()) return;
  // A condition whose status is what the claim already shows keeps its lastTransitionTime. The
  // claim as read for this prepare is the record of it, also across restarts and instances.
  for (kube::AllocatedDeviceStatus& device : devices) {
    for (const kube::AllocatedDeviceStatus& shown : claim.device_statuses) {
      if (shown.driver != device.driver || shown.pool != device.pool ||
          shown.device != device.device || shown.share_id != device.share_id) {
        continue;
      }
      for (kube::DeviceCondition& condition : device.conditions) {
        for (const kube::DeviceCondition& before : shown.conditions) {
          if (before.type == condition.type && before.status == condition.status) {
            condition.last_transition_time = before.last_transition_time;
          }
        }
      }
    }
  }
  Step("claim-status:write");
  // Decided on the claim as read for this prepare; wanted while the claim has its record (the
  // other instance of a rolling update may unprepare it before the write lands).
  options_.claim_status->Submit(
      {claim.api_version, claim.namespace_, claim.name, claim.uid, claim.resource_version},
      std::move(devices), [checkpoint = checkpoint_, uid = claim.uid] {
        auto record = checkpoint.Find(uid);
        return !record.ok() || record->has_value();
      });
}

}  // namespace vfio_dra::prepare
