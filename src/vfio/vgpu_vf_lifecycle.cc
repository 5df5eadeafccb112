#include "vfio/vgpu_vf_lifecycle.h"

#include <cerrno>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::vfio {
namespace {

std::string Describe(const std::string& vf, int type_id) {
  return "vGPU " + std::to_string(type_id) + " on VF " + vf;
}

}  // namespace

std::string VgpuVfLifecycle::File(const std::string& vf) const {
  return "bus/pci/devices/" + vf + "/nvidia/current_vgpu_type";
}

Result<int> VgpuVfLifecycle::CurrentType(const std::string& vf) const {
  auto text = sysfs_.Read(File(vf));
  if (!text.ok()) {
    return text.error().Wrap("VF " + vf +
                             " is not an NVIDIA vGPU VF now (is the vGPU manager "
                             "loaded and are its VFs enabled?)");
  }
  auto type = sysfs::ParseDecimalAttribute(*text);
  if (!type.ok() || *type < 0 || *type > 0x7fffffff) {
    return MakeError(ErrorKind::kInvalidArgument, sysfs_.Path(File(vf)) + ": not a vGPU type ID");
  }
  return static_cast<int>(*type);
}

Result<int> VgpuVfLifecycle::WriteType(const std::string& vf, int value, Deadline deadline) {
  return gate_.Write(vf, sysfs_.Path(File(vf)), std::to_string(value),
                     deadline.RemainingOr(timeout_));
}

Error VgpuVfLifecycle::NotOurs(const std::string& vf, int current) const {
  return MakeError(ErrorKind::kFailedPrecondition,
                   "VF " + vf + " already holds vGPU type " + std::to_string(current) +
                       " that vfio-dra did not create for this claim (another tool, an admin or "
                       "a VM outside Kubernetes made it); it is left alone. A VF takes one vGPU: "
                       "clear it once nothing uses it (echo 0 > " +
                       sysfs_.Path(File(vf)) +
                       ") or keep vfio-dra off the VF (deny: [{address: \"" + vf +
                       "\"}] in the policy)");
}

Status VgpuVfLifecycle::CheckFree(const std::string& vf) const {
  auto current = CurrentType(vf);
  if (!current.ok()) return current.error();
  if (*current != 0) return NotOurs(vf, *current);
  return Status::Ok();
}

Status VgpuVfLifecycle::CheckHolds(const std::string& vf, int type_id) const {
  auto current = CurrentType(vf);
  if (!current.ok()) return current.error().Wrap(Describe(vf, type_id));
  if (*current == type_id) return Status::Ok();
  return MakeError(
      ErrorKind::kFailedPrecondition,
      Describe(vf, type_id) + " was published as it existed, but the VF now holds " +
          (*current == 0 ? std::string("none") : "vGPU " + std::to_string(*current) + " instead") +
          "; vfio-dra hands out a vGPU it did not make only as it is, and makes none in its "
          "place (the kubelet retries with what the node publishes then)");
}

Status VgpuVfLifecycle::Assign(const std::string& vf, int type_id, Held held, Deadline deadline) {
  auto current = CurrentType(vf);
  if (!current.ok()) return current.error().Wrap(Describe(vf, type_id));
  if (*current == type_id && held == Held::kOurs) return Status::Ok();
  if (*current != 0) return NotOurs(vf, *current).Wrap(Describe(vf, type_id));
  auto err = WriteType(vf, type_id, deadline);
  if (!err.ok()) return err.error().Wrap("creating " + Describe(vf, type_id));
  if (*err == ENODEV) {
    std::string listed = "nothing";
    if (auto text = sysfs_.Read("bus/pci/devices/" + vf + "/nvidia/creatable_vgpu_types");
        text.ok()) {
      if (auto types = sysfs::ParseCreatableVgpuTypes(*text); types.ok() && !types->empty()) {
        listed.clear();
        for (const auto& type : *types) {
          listed += (listed.empty() ? "" : ", ") + std::to_string(type.id);
        }
      }
    }
    return MakeError(ErrorKind::kFailedPrecondition,
                     Describe(vf, type_id) +
                         ": the driver cannot create this type on the VF "
                         "now (ENODEV; creatable_vgpu_types lists " +
                         listed +
                         "). The GPU runs one vGPU type at a time and may be full: pin one type "
                         "per GPU in the policy (select: [{kind: vgpu, pf: \"<PF>\", vgpuType: "
                         "\"<ID>\"}]); the kubelet retries this claim until room is free or the "
                         "claim is deleted");
  }
  if (*err == EBUSY) {
    return MakeError(ErrorKind::kUnavailable, Describe(vf, type_id) +
                                                  ": the VF is open (EBUSY), so its type cannot be "
                                                  "set; the kubelet retries once it is let go");
  }
  if (*err != 0) {
    return MakeError(ErrorKind::kFailedPrecondition, "creating " + Describe(vf, type_id) +
                                                         ": writing " + sysfs_.Path(File(vf)) +
                                                         " failed: " + ErrnoText(*err));
  }
  return Confirm(vf, type_id);
}

Status VgpuVfLifecycle::Confirm(const std::string& vf, int type_id) const {
  auto now = CurrentType(vf);
  if (!now.ok()) return now.error().Wrap("confirming " + Describe(vf, type_id));
  if (*now != type_id) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     Describe(vf, type_id) + ": the driver accepted the type but the VF reads " +
                         std::to_string(*now));
  }
  return Status::Ok();
}

Result<VgpuVfLifecycle::Creation> VgpuVfLifecycle::CreateOnFree(const std::string& vf, int type_id,
                                                                Deadline deadline) {
  auto current = CurrentType(vf);
  if (!current.ok()) return current.error().Wrap("creating " + Describe(vf, type_id));
  if (*current != 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "creating " + Describe(vf, type_id) + ": the VF holds vGPU " +
                         std::to_string(*current) + " already; it is left alone");
  }
  auto err = WriteType(vf, type_id, deadline);
  if (!err.ok()) return err.error().Wrap("creating " + Describe(vf, type_id));
  if (*err == ENODEV) return Creation::kGpuFull;
  if (*err == EBUSY) return Creation::kVfBusy;
  if (*err != 0) {
    return MakeError(ErrorKind::kFailedPrecondition, "creating " + Describe(vf, type_id) +
                                                         ": writing " + sysfs_.Path(File(vf)) +
                                                         " failed: " + ErrnoText(*err));
  }
  if (Status s = Confirm(vf, type_id); !s.ok()) return s.error();
  return Creation::kCreated;
}

Result<std::string> VgpuVfLifecycle::Clear(const std::string& vf, int type_id, Deadline deadline) {
  auto current = CurrentType(vf);
  if (!current.ok()) {
    // No VF, or no vGPU manager on it: either way its vGPU went with it, and the kernel
    // re-creates a VF without one.
    if (current.error().kind == ErrorKind::kNotFound) {
      return "VF " + vf + " is gone (" + sysfs_.Path(File(vf)) + " does not exist), and " +
             Describe(vf, type_id) + " with it; nothing to remove";
    }
    return current.error().Wrap("removing " + Describe(vf, type_id));
  }
  if (*current == 0) return std::string();
  if (*current != type_id) {
    return MakeError(ErrorKind::kFailedPrecondition, "removing " + Describe(vf, type_id) +
                                                         ": the VF holds vGPU " +
                                                         std::to_string(*current) +
                                                         " instead, which this claim did not make; "
                                                         "it is left alone");
  }
  auto err = WriteType(vf, 0, deadline);
  if (!err.ok()) {
    return err.error().Wrap("removing " + Describe(vf, type_id) +
                            " (it is probably still in use by a VM; retry once it is let go)");
  }
  if (*err == EBUSY) {
    return MakeError(ErrorKind::kUnavailable,
                     "removing " + Describe(vf, type_id) +
                         " failed: EBUSY (a VM still has the VF open); the kubelet retries the "
                         "unprepare, which finishes once the VM lets go");
  }
  if (*err != 0) {
    return MakeError(ErrorKind::kFailedPrecondition, "removing " + Describe(vf, type_id) +
                                                         ": writing 0 to " + sysfs_.Path(File(vf)) +
                                                         " failed: " + ErrnoText(*err));
  }
  auto now = CurrentType(vf);
  if (!now.ok()) return now.error().Wrap("confirming the removal of " + Describe(vf, type_id));
  if (*now != 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "removing " + Describe(vf, type_id) +
                         ": the driver accepted 0 but the VF still reads " + std::to_string(*now));
  }
  return std::string();
}

}  // namespace vfio_dra::vfio
