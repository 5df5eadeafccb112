// What a prepare decision refuses before anything is recorded or touched: a device another claim
// holds (or may hold: an unreadable record), a vGPU VF that is not as the plan needs it, a device
// whose feature lacks a privilege the process does not have, and after a reboot a recorded
// function that is now another device.
#include <algorithm>

#include "prepare/vfio_device_preparer.h"

namespace vfio_dra::prepare {
namespace {

Error HeldByOther(const std::string& device, const std::string& what, const ClaimRecord& other) {
  return MakeError(
      ErrorKind::kFailedPrecondition,
      "device " + device + ": " + what + " is already prepared for " + other.Display() + " (" +
          (other.state == PrepareState::kPrepareCompleted ? "PrepareCompleted" : "PrepareStarted") +
          "); a device is never handed to two claims at once. Unprepare that claim "
          "first: the kubelet does so when its pod is gone (after a node reboot or "
          "a force-deleted pod, once it cleans the pod up)");
}

// The features preparing `device` uses: a function already on its VFIO driver is used as it is,
// and an mdev or vGPU vfio-dra does not make is handed out as it is.
std::vector<vfio::PrivilegedFeature> FeaturesOf(const PlannedDevice& device,
                                                const sysfs::SysfsReader& sysfs) {
  using vfio::PrivilegedFeature;
  std::vector<PrivilegedFeature> features{PrivilegedFeature::kDeviceNodes};
  switch (device.kind) {
    case PlannedKind::kPci:
      for (const std::string& f : device.functions) {
        auto driver = sysfs.LinkBaseName("bus/pci/devices/" + f + "/driver");
        if (!driver.ok() || *driver != VfioDriverOf(device, f)) {
          features.push_back(PrivilegedFeature::kPciPassthrough);
          break;
        }
      }
      if (device.vf_link && !device.config.network.Empty()) {
        features.push_back(PrivilegedFeature::kVfNetwork);
      }
      break;
    case PlannedKind::kMdev:
      if (device.mdev_created_by_driver) features.push_back(PrivilegedFeature::kMdev);
      break;
    case PlannedKind::kVgpu:
      if (MakesVgpu(device)) features.push_back(PrivilegedFeature::kVgpuVf);
      break;
  }
  return features;
}

}  // namespace

Status VfioDevicePreparer::CheckPrivilegesOf(const std::vector<PlannedDevice>& plan) const {
  if (!options_.missing_privileges) return Status::Ok();
  const auto missing = options_.missing_privileges();
  if (missing == nullptr || missing->empty()) return Status::Ok();
  for (const PlannedDevice& device : plan) {
    for (vfio::PrivilegedFeature feature : FeaturesOf(device, sysfs_)) {
      if (const vfio::MissingPrivilege* m = vfio::FindMissing(*missing, feature)) {
        return MakeError(ErrorKind::kFailedPrecondition,
                         "device " + device.result.device + " is not prepared: " + m->Line());
      }
    }
  }
  return Status::Ok();
}

Status VfioDevicePreparer::CheckOverlap(const CheckpointView& view, const std::string& uid,
                                        const std::vector<PlannedDevice>& plan) const {
  // Every other record is checked on every prepare, and a record holds a function or two: plain
  // scans, not a set and two maps built per record.
  const auto holds_function = [](const ClaimRecord& other, const std::string& address) {
    return std::any_of(other.functions.begin(), other.functions.end(),
                       [&](const FunctionRecord& f) { return f.address == address; });
  };
  // A record that cannot be read may hold any device, these ones included: handing them out could
  // give one device to two claims.
  for (const auto& [other_uid, reason] : view.unreadable) {
    if (other_uid == uid || plan.empty()) continue;
    return MakeError(ErrorKind::kUnavailable,
                     "device " + plan.front().result.device +
                         " is not prepared: the checkpoint record of claim uid " + other_uid +
                         " cannot be used (" + reason +
                         ") and may hold it; make the file readable, or move it out of " +
                         checkpoint_.directory() + " after returning that claim's devices by hand");
  }
  for (const auto& [other_uid, shared] : view.claims) {
    if (other_uid == uid) continue;
    const ClaimRecord& other = *shared;
    for (const PlannedDevice& device : plan) {
      const std::string& name = device.result.device;
      if (device.kind == PlannedKind::kVgpu) {
        const bool held =
            holds_function(other, device.address) ||
            std::any_of(other.vgpus.begin(), other.vgpus.end(),
                        [&](const VgpuRecord& v) { return v.address == device.address; });
        if (held) return HeldByOther(name, "VF " + device.address, other);
      } else if (device.kind == PlannedKind::kPci) {
        for (const std::string& f : device.functions) {
          if (holds_function(other, f)) return HeldByOther(name, "PCI function " + f, other);
          for (const MdevRecord& m : other.mdevs) {
            if (m.parent == f) {
              return HeldByOther(name, "PCI function " + f + " (parent of mdev " + m.uuid + ")",
                                 other);
            }
          }
        }
      } else {
        for (const MdevRecord& m : other.mdevs) {
          if (m.uuid == device.mdev.uuid) {
            return HeldByOther(name, "mdev " + device.mdev.uuid, other);
          }
        }
        if (holds_function(other, device.mdev.parent)) {
          return HeldByOther(name, "its parent " + device.mdev.parent + " (passed through whole)",
                             other);
        }
      }
    }
  }
  return Status::Ok();
}

Status VfioDevicePreparer::CheckNewVgpus(const std::vector<PlannedDevice>& plan,
                                         const std::optional<ClaimRecord>& existing) const {
  for (const PlannedDevice& device : plan) {
    if (device.kind != PlannedKind::kVgpu) continue;
    // A VF the claim's record holds was judged when it was recorded: whatever it holds now is
    // what the record says (a type this claim set before a crash, or the one handed out).
    if (existing && FindVgpu(*existing, device.address) != nullptr) continue;
    // A type the VF holds that no record of ours set (it appeared between publish and prepare)
    // is someone else's: taking it would hand their vGPU out and destroy it at unprepare.
    Status s = MakesVgpu(device) ? vgpus_.CheckFree(device.address)
                                 : vgpus_.CheckHolds(device.address, device.vgpu_type);
    if (!s.ok()) return s.error().Wrap("device " + device.result.device);
  }
  return Status::Ok();
}

Status VfioDevicePreparer::CheckIdentities(const ClaimRecord& record) const {
  std::vector<std::pair<std::string, PciIdentity>> recorded;
  for (const FunctionRecord& f : record.functions) recorded.emplace_back(f.address, f.identity);
  for (const VgpuRecord& v : record.vgpus) recorded.emplace_back(v.address, v.identity);
  for (const auto& [address, identity] : recorded) {
    if (!identity.Known()) continue;
    auto now = ReadIdentity(address);
    if (!now.ok()) {
      return now.error().Wrap("after a reboot, cannot check that " + address +
                              " is still the device that was prepared");
    }
    if (!(*now == identity)) {
      return MakeError(ErrorKind::kFailedPrecondition,
                       "after a reboot, PCI " + address + " is " + now->Display() +
                           ", not the device " + identity.Display() +
                           " that was prepared for this claim (the node's PCI addresses "
                           "changed); it cannot be prepared again here: delete the pod so the "
                           "claim is allocated again");
    }
  }
  return Status::Ok();
}

}  // namespace vfio_dra::prepare
