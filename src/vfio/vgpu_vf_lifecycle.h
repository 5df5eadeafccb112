// VgpuVfLifecycle: sets and clears the vGPU type of an NVIDIA vGPU VF through the files the
// vGPU manager's VFIO framework gives each VF (no mdev): writing a type ID to
// nvidia/current_vgpu_type creates the vGPU, writing 0 destroys it, and a read says what the VF
// holds. The VF is never rebound: it stays on nvidia, which is its VFIO provider. Every change is
// confirmed by reading the file back. The kernel refuses a change while a VMM has the VF open
// (EBUSY) and a type the VF cannot take now (ENODEV); both become errors that name the VF and
// what to do. Writes go through the DeviceLockGate, so a store that blocks in the driver holds
// only the caller's deadline.
#pragma once

#include <chrono>
#include <string>

#include "base/deadline.h"
#include "base/result.h"
#include "sysfs/sysfs_reader.h"
#include "sysfs/sysfs_writer.h"
#include "vfio/device_lock_gate.h"

namespace vfio_dra::vfio {

class VgpuVfLifecycle {
 public:
  VgpuVfLifecycle(const sysfs::SysfsReader& sysfs, DeviceLockGate& gate,
                  std::chrono::milliseconds timeout)
      : sysfs_(sysfs), gate_(gate), timeout_(timeout) {}

  // Whose a type the VF holds already is. The VF cannot say: another tool, an admin or a VM
  // outside Kubernetes may have set it. Only the caller's crash-safe record can: it is written
  // before the type is set, so a crash after the write leaves the type and the record that it is
  // ours.
  enum class Held {
    kNotOurs,  // no record says this claim set it
    kOurs,     // the claim's record says it was setting this type on this VF
  };

  // The type the VF holds now (0: none); an error when the VF is not a vGPU VF (any more).
  Result<int> CurrentType(const std::string& vf) const;
  // Fine when the VF holds no vGPU. One it holds is not vfio-dra's to take or destroy: the error
  // names the VF, the type and how to clear it.
  Status CheckFree(const std::string& vf) const;
  // Fine when the VF holds `type_id` (a vGPU made outside vfio-dra, handed out as it is).
  Status CheckHolds(const std::string& vf, int type_id) const;
  // Gives the VF a vGPU of `type_id`. A VF that holds that type already is fine only when `held`
  // says so; otherwise, or when it holds another type, it is an error and the VF is left alone.
  Status Assign(const std::string& vf, int type_id, Held held, Deadline deadline = {});
  // How a declared layout's write to a free VF ended when it did not fail: the layout applier
  // needs the driver's refusals as answers (ENODEV: the GPU holds no more of the type; EBUSY: the
  // VF is open), not as errors to hand to a claim.
  enum class Creation { kCreated, kGpuFull, kVfBusy };
  // Gives a VF that holds no vGPU one of `type_id`; a VF that holds one (of any type) is an error
  // and is left alone. Other write errors and an unconfirmed type are errors too.
  Result<Creation> CreateOnFree(const std::string& vf, int type_id, Deadline deadline = {});
  // Destroys the VF's vGPU of `type_id`. A VF that holds none is fine; one that holds another
  // type (not the one vfio-dra made) is an error, and is left alone. A VF that is gone (removed,
  // its PF's VFs disabled, the vGPU manager unloaded) took its vGPU with it: that is done too,
  // and the returned warning says what was not there (empty when nothing needs saying).
  Result<std::string> Clear(const std::string& vf, int type_id, Deadline deadline = {});

 private:
  std::string File(const std::string& vf) const;
  Error NotOurs(const std::string& vf, int current) const;
  // Writes `value` to the VF's current_vgpu_type and returns the write's errno.
  Result<int> WriteType(const std::string& vf, int value, Deadline deadline);
  // Fine when the VF reads `type_id` after a write the driver accepted.
  Status Confirm(const std::string& vf, int type_id) const;

  const sysfs::SysfsReader& sysfs_;
  DeviceLockGate& gate_;
  std::chrono::milliseconds timeout_;
};

}  // namespace vfio_dra::vfio
