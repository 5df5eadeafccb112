// See device_lock_keys.h.
#include "prepare/device_lock_keys.h"

namespace vfio_dra::prepare {

void AddDeviceKeys(const ClaimRecord& record, std::set<std::string>& keys) {
  for (const FunctionRecord& f : record.functions) keys.insert(f.address);
  for (const MdevRecord& m : record.mdevs) keys.insert(m.parent);
  // A vGPU's PF too, as prepare locks it (the published device's parent): a VF's type changes
  // what every VF of its GPU can take.
  for (const VgpuRecord& v : record.vgpus) {
    keys.insert(v.address);
    if (!v.pf.empty()) keys.insert(v.pf);
  }
  for (const RecordedDevice& device : record.devices) {
    keys.insert(device.functions.begin(), device.functions.end());
    if (device.is_mdev) keys.insert(device.mdev.parent);
    if (device.is_vgpu) keys.insert(device.address);
  }
}

void AddDeviceKeys(const std::vector<PlannedDevice>& plan, std::set<std::string>& keys) {
  for (const PlannedDevice& device : plan) {
    if (device.kind == PlannedKind::kPci) {
      keys.insert(device.functions.begin(), device.functions.end());
    } else if (device.kind == PlannedKind::kVgpu) {
      keys.insert(device.address);
    } else {
      keys.insert(device.mdev.parent);
    }
  }
}

}  // namespace vfio_dra::prepare
