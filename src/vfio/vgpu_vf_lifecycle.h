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

  // The type the VF holds now (0: none); an error when the VF is not a vGPU VF (any more).
  Result<int> CurrentType(const std::string& vf) const;
  // Gives the VF a vGPU of `type_id`. A VF that holds that type already is fine (a retry after a
  // crash); one that holds another type is an error, and is left alone.
  Status Assign(const std::string& vf, int type_id, Deadline deadline = {});
  // Destroys the VF's vGPU of `type_id`. A VF that holds none is fine; one that holds another
  // type (not the one vfio-dra made) is an error, and is left alone.
  Status Clear(const std::string& vf, int type_id, Deadline deadline = {});

 private:
  std::string File(const std::string& vf) const;
  // Writes `value` to the VF's current_vgpu_type and returns the write's errno.
  Result<int> WriteType(const std::string& vf, int value, Deadline deadline);

  const sysfs::SysfsReader& sysfs_;
  DeviceLockGate& gate_;
  std::chrono::milliseconds timeout_;
};

}  // namespace vfio_dra::vfio
