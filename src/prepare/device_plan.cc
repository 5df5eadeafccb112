#include "prepare/device_plan.h"

#include <algorithm>

#include "base/k8s_names.h"
#include "base/text.h"
#include "discovery/inventory_scanner.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/device_names.h"
#include "slicepublisher/device_taints.h"
#include "slicepublisher/slice_json.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::prepare {
namespace {

using slicepublisher::PublishedDeviceView;
// Right after a restart the first publish follows within milliseconds when the API server is
// up (the claim was just read from it); waiting that long after startup spares the pod a retry.
constexpr std::chrono::seconds kWaitForFirstPublish{5};
// PCI base class 0x02: network controllers (Ethernet, InfiniBand, ...).
constexpr uint32_t kNetworkClass = 0x02;

Error Mismatch(const std::string& device, const std::string& what) {
  return MakeError(ErrorKind::kFailedPrecondition,
                   "device " + device + " no longer matches what was published: " + what +
                       "; the node's hardware changed since the claim was allocated, so it must "
                       "be allocated again");
}

// An error when `address` is held by a blocked operation of ours.
Status CheckNotBusy(const PlanContext& context, const std::string& address) {
  if (!context.busy) return Status::Ok();
  if (auto busy = context.busy(address)) return MakeError(ErrorKind::kUnavailable, *busy);
  return Status::Ok();
}

// The VFIO driver for `fn`; an error naming what to do when that driver is not loaded.
Result<std::string> ChooseVfioDriver(const PlanContext& context, const discovery::PciFunction& fn) {
  if (context.vfio_drivers == nullptr) return std::string(vfio::kVfioPciDriver);
  const discovery::VfioDriverChoice choice = context.vfio_drivers->Choose(fn, context.sysfs);
  if (choice.loaded) return choice.driver;
  const std::string module = choice.module.empty() ? choice.driver : choice.module;
  return MakeError(ErrorKind::kFailedPrecondition,
                   "PCI function " + fn.address + " is to be bound to " + choice.driver + " (" +
                       choice.why + "), which is not loaded: load it on the node (modprobe " +
                       module + "), or choose another driver for it in the policy (vfioDrivers: " +
                       "[{match: {address: \"" + fn.address + "\"}, use: vfio-pci}])");
}

// The functions of `group` that must be bound with the device (every PCI function but bridges),
// with the VFIO driver of each added to `drivers`.
Result<std::vector<std::string>> GroupFunctions(const PlanContext& context, int group,
                                                const std::string& device,
                                                std::map<std::string, std::string>& drivers) {
  const sysfs::SysfsReader& sysfs = context.sysfs;
  const std::string dir = "kernel/iommu_groups/" + std::to_string(group) + "/devices";
  auto entries = sysfs.List(dir);
  if (!entries.ok()) {
    return entries.error().Wrap("cannot list IOMMU group " + std::to_string(group));
  }
  std::vector<std::string> functions{device};
  for (const std::string& entry : *entries) {
    auto address = sysfs::CanonicalBdf(entry);
    if (!address.ok() || *address == device) continue;
    if (Status s = CheckNotBusy(context, *address); !s.ok()) {
      return s.error().Wrap("IOMMU group " + std::to_string(group) + " of " + device);
    }
    auto fn = discovery::ReadPciFunction(context.sysfs, *address);
    if (!fn.ok()) {
      return fn.error().Wrap("IOMMU group " + std::to_string(group) + " of " + device +
                             " has a member that cannot be read, so the group cannot be handed "
                             "out safely");
    }
    if (fn->IsBridge()) continue;
    auto driver = ChooseVfioDriver(context, *fn);
    if (!driver.ok()) {
      return driver.error().Wrap("IOMMU group " + std::to_string(group) + " of " + device);
    }
    drivers[*address] = *driver;
    functions.push_back(*address);
  }
  return functions;
}

// Mediated devices that exist on `parent` now (0 when it is not an mdev parent).
int MdevInstanceCount(const sysfs::SysfsReader& sysfs, const std::string& parent) {
  const std::string types = "class/mdev_bus/" + parent + "/mdev_supported_types";
  auto type_ids = sysfs.List(types);
  if (!type_ids.ok()) return 0;
  int count = 0;
  for (const std::string& type : *type_ids) {
    if (auto devices = sysfs.List(types + "/" + type + "/devices"); devices.ok()) {
      count += static_cast<int>(devices->size());
    }
  }
  return count;
}

Result<PlannedDevice> PlanPci(PlannedDevice planned, const PublishedDeviceView& published,
                              const PlanContext& context) {
  const std::string& name = planned.result.device;
  const auto& address = published.pci_bus_id;
  if (!address) {
    return MakeError(ErrorKind::kInternal, "published device " + name + " has no " +
                                               slicepublisher::attribute::kPciBusId);
  }
  planned.address = *address;
  if (Status s = CheckNotBusy(context, *address); !s.ok()) {
    return s.error().Wrap("device " + name);
  }
  auto fn = discovery::ReadPciFunction(context.sysfs, *address);
  if (!fn.ok()) {
    if (fn.error().kind == ErrorKind::kNotFound) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + name + " (PCI " + *address +
                           ") has vanished from the node since it was published");
    }
    return fn.error().Wrap("cannot re-check device " + name);
  }
  const auto& vendor = published.vendor_id;
  const auto& device = published.device_id;
  if (vendor && device && (*vendor != fn->vendor_id || *device != fn->device_id)) {
    return Mismatch(name, "PCI " + *address + " is now a different device");
  }
  const auto& group = published.iommu_group;
  if (group.has_value() != fn->iommu_group.has_value() ||
      (group && *group != static_cast<int64_t>(*fn->iommu_group))) {
    return Mismatch(name, "the IOMMU group of PCI " + *address + " changed");
  }
  if (fn->IsBridge()) return Mismatch(name, "PCI " + *address + " is a bridge");
  if (fn->sriov_pf && fn->sriov_pf->num_vfs > 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "device " + name + " (PCI " + *address + ") is an SR-IOV PF with " +
                         std::to_string(fn->sriov_pf->num_vfs) +
                         " VFs enabled; vfio-pci refuses such a PF");
  }
  if (auto instances = MdevInstanceCount(context.sysfs, *address); instances > 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "device " + name + " (PCI " + *address + ") has " + std::to_string(instances) +
                         " mediated devices; the whole GPU cannot be handed out while they exist");
  }
  if (fn->sriov_vf && fn->BaseClass() == kNetworkClass) {
    // The VF's number as published, re-checked: the PF's virtfn<N> link must still name it.
    const auto index =
        slicepublisher::IntAttribute(planned.published, slicepublisher::attribute::kVfIndex);
    const std::string link =
        "bus/pci/devices/" + fn->sriov_vf->pf + "/virtfn" + std::to_string(index.value_or(-1));
    auto target = context.sysfs.LinkBaseName(link);
    if (!index || !target.ok() || *target != *address) {
      return Mismatch(name, "PCI " + *address + " is no longer VF " +
                                std::to_string(index.value_or(-1)) + " of " + fn->sriov_vf->pf);
    }
    planned.vf_link = vfio::VfLink{fn->sriov_vf->pf, static_cast<int>(*index)};
  }
  if (!planned.config.network.Empty() && !planned.vf_link) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "VfioConfig " + planned.config.network.Display() +
                         " applies only to SR-IOV VFs of network adapters, and device " + name +
                         " (PCI " + *address + ") is not one");
  }
  auto vfio_driver = ChooseVfioDriver(context, *fn);
  if (!vfio_driver.ok()) return vfio_driver.error().Wrap("device " + name);
  planned.vfio_drivers[*address] = *vfio_driver;
  if (fn->iommu_group) {
    planned.iommu_group = *fn->iommu_group;
    auto functions = GroupFunctions(context, *fn->iommu_group, *address, planned.vfio_drivers);
    if (!functions.ok()) return functions.error();
    planned.functions = std::move(*functions);
  } else {
    planned.functions = {*address};
  }
  return planned;
}

Result<PlannedDevice> PlanMdev(PlannedDevice planned, const PublishedDeviceView& published,
                               const PlanContext& context) {
  const std::string& name = planned.result.device;
  const auto& uuid = published.mdev_uuid;
  const auto& type = published.mdev_type;
  const auto& parent = published.mdev_parent;
  if (!uuid || !type || !parent) {
    return MakeError(ErrorKind::kInternal,
                     "published device " + name + " lacks mdevUUID, mdevType or mdevParent");
  }
  if (!planned.config.network.Empty()) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "VfioConfig " + planned.config.network.Display() +
                         " applies only to SR-IOV VFs of network adapters, and device " + name +
                         " is a mediated device");
  }
  planned.kind = PlannedKind::kMdev;
  planned.mdev = {*parent, *type, *uuid};
  planned.mdev_created_by_driver = name != slicepublisher::ForeignMdevDeviceName(*uuid);
  if (Status s = CheckNotBusy(context, *parent); !s.ok()) return s.error().Wrap("device " + name);
  if (!context.sysfs.Exists("class/mdev_bus/" + *parent)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "device " + name + ": the mdev parent " + *parent +
                         " has vanished from the node since it was published");
  }
  if (!planned.mdev_created_by_driver && !context.sysfs.Exists("bus/mdev/devices/" + *uuid)) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "device " + name + ": the existing mdev " + *uuid + " has been removed");
  }
  return planned;
}

// A vGPU on an NVIDIA vGPU VF: the VF must still be the vGPU VF that was published, in its
// group. Whether it can take the type now is the driver's to say when prepare sets it.
Result<PlannedDevice> PlanVgpu(PlannedDevice planned, const PublishedDeviceView& published,
                               const PlanContext& context) {
  const std::string& name = planned.result.device;
  if (!published.pci_bus_id || !published.vgpu_type_id || *published.vgpu_type_id <= 0 ||
      *published.vgpu_type_id > 0x7fffffff) {
    return MakeError(ErrorKind::kInternal, "published device " + name + " lacks " +
                                               slicepublisher::attribute::kPciBusId + " or " +
                                               slicepublisher::attribute::kVgpuTypeId);
  }
  if (!planned.config.network.Empty()) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "VfioConfig " + planned.config.network.Display() +
                         " applies only to SR-IOV VFs of network adapters, and device " + name +
                         " is a vGPU");
  }
  const std::string& address = *published.pci_bus_id;
  planned.kind = PlannedKind::kVgpu;
  planned.address = address;
  planned.vgpu_type = static_cast<int>(*published.vgpu_type_id);
  if (Status s = CheckNotBusy(context, address); !s.ok()) return s.error().Wrap("device " + name);
  auto fn = discovery::ReadPciFunction(context.sysfs, address);
  if (!fn.ok()) {
    if (fn.error().kind == ErrorKind::kNotFound) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + name + " (VF " + address +
                           ") has vanished from the node since it was published");
    }
    return fn.error().Wrap("cannot re-check device " + name);
  }
  if (!fn->vgpu_vf) return Mismatch(name, "PCI " + address + " is no longer an NVIDIA vGPU VF");
  if ((published.vendor_id && *published.vendor_id != fn->vendor_id) ||
      (published.device_id && *published.device_id != fn->device_id)) {
    return Mismatch(name, "PCI " + address + " is now a different device");
  }
  const auto& group = published.iommu_group;
  if (!group || !fn->iommu_group || *group != static_cast<int64_t>(*fn->iommu_group)) {
    return Mismatch(name, "the IOMMU group of VF " + address + " changed");
  }
  planned.iommu_group = *fn->iommu_group;
  return planned;
}

// A replayed device's functions must still be in the IOMMU group its record names: the CDI spec
// hands out /dev/vfio/<group>, and after VFs are re-created or a card is added (groups are
// numbered as devices are found) that number can be another device's.
Status CheckRecordedGroup(const sysfs::SysfsReader& sysfs, const PlannedDevice& planned) {
  if (!planned.iommu_group) return Status::Ok();  // no-IOMMU mode: read when the spec is written
  const std::vector<std::string> functions = planned.kind == PlannedKind::kPci
                                                 ? planned.functions
                                                 : std::vector<std::string>{planned.address};
  const std::string recorded = std::to_string(*planned.iommu_group);
  for (const std::string& address : functions) {
    const std::string link = "bus/pci/devices/" + address + "/iommu_group";
    auto group = sysfs.LinkBaseName(link);
    if (!group.ok()) {
      return group.error().Wrap("device " + planned.result.device + ": cannot check that PCI " +
                                address + " is still in IOMMU group " + recorded +
                                ", as recorded when the claim was prepared");
    }
    if (*group != recorded) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + planned.result.device + ": PCI " + address +
                           " is now in IOMMU group " + EscapeForDisplay(*group, 32) +
                           ", not group " + recorded +
                           " as recorded when the claim was prepared (the node's groups were "
                           "renumbered: VFs re-created or a device added), so /dev/vfio/" +
                           recorded +
                           " may be another device's; it cannot be prepared again here: delete "
                           "the pod so the claim is allocated again");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<PlannedDevice>> PlanClaim(
    const kube::ResourceClaim& claim, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    const PlanContext& context) {
  if (!context.published.WaitForFirstPublish(kWaitForFirstPublish)) {
    return MakeError(ErrorKind::kUnavailable,
                     "this node's devices have not been published yet (is the API server "
                     "reachable?); the kubelet will retry");
  }
  std::vector<PlannedDevice> plan;
  for (const auto& result : ours) {
    // Request names become directory names of the metadata files: refuse anything else before
    // the node is touched.
    const std::string base = kube::BaseRequestName(result.request);
    const std::string sub =
        base.size() < result.request.size() ? result.request.substr(base.size() + 1) : "";
    if (!IsDnsLabel(base) || (base.size() < result.request.size() && !IsDnsLabel(sub))) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "request \"" + EscapeForDisplay(result.request, 80) +
                           "\" is not a valid request name (a DNS label, or "
                           "<request>/<subrequest>)");
    }
    if (!IsDnsLabel(result.device)) {
      return MakeError(ErrorKind::kInvalidArgument, "request " + result.request + ": device \"" +
                                                        EscapeForDisplay(result.device, 80) +
                                                        "\" is not a valid device name");
    }
    PlannedDevice planned;
    planned.result = result;
    if (result.admin_access) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "request " + result.request + " asks for adminAccess to " + result.device +
                           "; VFIO devices belong to one VM at a time, so vfio-dra does not "
                           "support admin access");
    }
    if (result.pool != context.node_name) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + result.device + " was allocated from pool " + result.pool +
                           ", but this node publishes pool " + context.node_name);
    }
    auto published = context.published.Find(result.pool, result.device);
    if (!published) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "device " + result.device +
                           " is not (or no longer) published by this node; it may have been "
                           "removed or excluded by the admin policy");
    }
    for (const slicepublisher::DeviceTaint& taint : published->taints) {
      // The scheduler allocates past a taint only for claims that tolerate it; this one is about
      // the host, not the VM, so no toleration makes binding the group safe.
      if (slicepublisher::TaintCause(taint, context.driver) ==
          slicepublisher::taint::kGroupUnsafe) {
        return MakeError(ErrorKind::kFailedPrecondition,
                         "device " + result.device + " is tainted " + taint.key +
                             ": its IOMMU group holds a function the host uses, and binding the "
                             "group would take it away; free the group or allocate another device");
      }
    }
    planned.published = *published;
    for (const auto& [name, value] : published->attributes) {
      planned.attributes[name] = slicepublisher::AttributeJson(value);
    }
    auto config = ConfigForRequest(claim.allocation->config, context.driver, result.request);
    if (!config.ok()) return config.error().Wrap("request " + result.request);
    planned.config = *config;
    const PublishedDeviceView view = slicepublisher::DecodePublishedDevice(*published);
    auto done = view.IsMdev()   ? PlanMdev(std::move(planned), view, context)
                : view.IsVgpu() ? PlanVgpu(std::move(planned), view, context)
                                : PlanPci(std::move(planned), view, context);
    if (!done.ok()) return done.error();
    plan.push_back(std::move(*done));
  }
  return plan;
}

bool MakesVgpu(const PlannedDevice& device) { return !device.published.consumes_counters.empty(); }

std::string VfioDriverOf(const PlannedDevice& device, const std::string& address) {
  auto it = device.vfio_drivers.find(address);
  return it == device.vfio_drivers.end() ? std::string(vfio::kVfioPciDriver) : it->second;
}

RecordedDevice RecordOf(const PlannedDevice& device) {
  RecordedDevice out;
  out.request = device.result.request;
  out.pool = device.result.pool;
  out.device = device.result.device;
  out.share_id = device.result.share_id;
  out.is_mdev = device.kind == PlannedKind::kMdev;
  out.is_vgpu = device.kind == PlannedKind::kVgpu;
  out.vgpu_type = device.vgpu_type;
  out.address = device.address;
  out.functions = device.functions;
  out.iommu_group = device.iommu_group;
  out.mdev = device.mdev;
  out.mdev_created_by_driver = device.mdev_created_by_driver;
  out.iommu_interface = IommuInterfaceName(device.config.iommu);
  out.attributes = device.attributes;
  out.vf_link = device.vf_link;
  out.network = device.config.network;
  return out;
}

Result<std::vector<PlannedDevice>> PlanFromRecord(
    const ClaimRecord& record, const std::vector<kube::DeviceRequestAllocationResult>& ours,
    const sysfs::SysfsReader& sysfs) {
  auto describe = [](const std::string& request, const std::string& pool,
                     const std::string& device) { return request + "=" + pool + "/" + device; };
  std::vector<std::string> allocated;
  allocated.reserve(ours.size());
  for (const auto& result : ours) {
    allocated.push_back(describe(result.request, result.pool, result.device));
  }
  std::vector<std::string> prepared;
  prepared.reserve(record.devices.size());
  for (const RecordedDevice& d : record.devices) {
    prepared.push_back(describe(d.request, d.pool, d.device));
  }
  if (allocated != prepared) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "the claim is allocated [" + Join(allocated, ", ") +
                         "] but was prepared for [" + Join(prepared, ", ") +
                         "]; it was allocated again while still prepared on this node, so it must "
                         "be unprepared first (the kubelet does so once its old pod is gone)");
  }
  std::vector<PlannedDevice> plan;
  for (size_t i = 0; i < ours.size(); ++i) {
    const RecordedDevice& d = record.devices[i];
    PlannedDevice planned;
    planned.result = ours[i];
    planned.kind = d.is_mdev   ? PlannedKind::kMdev
                   : d.is_vgpu ? PlannedKind::kVgpu
                               : PlannedKind::kPci;
    planned.vgpu_type = d.vgpu_type;
    planned.address = d.address;
    planned.functions = d.functions;
    for (const FunctionRecord& f : record.functions) {
      if (std::find(d.functions.begin(), d.functions.end(), f.address) != d.functions.end()) {
        planned.vfio_drivers[f.address] = f.vfio_driver;
      }
    }
    planned.iommu_group = d.iommu_group;
    planned.mdev = d.mdev;
    planned.mdev_created_by_driver = d.mdev_created_by_driver;
    planned.attributes = d.attributes;
    planned.vf_link = d.vf_link;
    planned.config.network = d.network;
    bool known = false;
    for (IommuInterface iommu :
         {IommuInterface::kLegacy, IommuInterface::kIommufd, IommuInterface::kBoth}) {
      if (d.iommu_interface == IommuInterfaceName(iommu)) {
        planned.config.iommu = iommu;
        known = true;
      }
    }
    if (!known) {
      return MakeError(ErrorKind::kDataLoss, "the checkpoint record of device " + d.device +
                                                 " has an unknown iommuInterface \"" +
                                                 d.iommu_interface + "\"");
    }
    if (Status s = CheckRecordedGroup(sysfs, planned); !s.ok()) return s.error();
    plan.push_back(std::move(planned));
  }
  return plan;
}

Result<vfio::VfLink> ReadVfLink(const sysfs::SysfsReader& sysfs, const std::string& address) {
  const std::string dir = "bus/pci/devices/" + address;
  auto physfn = sysfs.LinkBaseName(dir + "/physfn");
  if (!physfn.ok()) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "PCI " + address + " is no longer an SR-IOV VF (" +
                         sysfs.Path(dir + "/physfn") + ": " + physfn.error().message +
                         "); it cannot be prepared again here: delete the pod so the claim is "
                         "allocated again");
  }
  auto pf = sysfs::CanonicalBdf(*physfn);
  if (!pf.ok()) return pf.error().Wrap(sysfs.Path(dir + "/physfn"));
  const std::string pf_dir = "bus/pci/devices/" + *pf;
  auto entries = sysfs.List(pf_dir);
  if (!entries.ok()) return entries.error().Wrap("cannot list the VFs of " + *pf);
  for (const std::string& name : *entries) {
    if (name.rfind("virtfn", 0) != 0) continue;
    auto index = sysfs::ParseDecimalAttribute(name.substr(6));
    auto target = sysfs.LinkBaseName(pf_dir + "/" + name);
    if (index.ok() && target.ok() && *target == address) {
      return vfio::VfLink{*pf, static_cast<int>(*index)};
    }
  }
  return MakeError(ErrorKind::kFailedPrecondition, "PCI " + address + " names " + *pf +
                                                       " as its PF, but no virtfn link of " +
                                                       sysfs.Path(pf_dir) + " names it");
}

Status RelinkVfs(const sysfs::SysfsReader& sysfs, std::vector<PlannedDevice>& plan) {
  for (PlannedDevice& device : plan) {
    if (!device.vf_link) continue;
    auto link = ReadVfLink(sysfs, device.address);
    if (!link.ok()) return link.error().Wrap("device " + device.result.device);
    device.vf_link = std::move(*link);
  }
  return Status::Ok();
}

}  // namespace vfio_dra::prepare
