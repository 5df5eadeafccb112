// See claim_record.h.
#include "prepare/claim_record.h"

namespace vfio_dra::prepare {

std::string PciIdentity::Display() const {
  std::string out = vendor + ":" + device;
  if (!subsystem_vendor.empty()) {
    out += " (subsystem " + subsystem_vendor + ":" + subsystem_device + ")";
  }
  return out;
}

FunctionRecord FunctionRecord::From(const vfio::OriginalBinding& binding, PciIdentity identity) {
  return FunctionRecord{binding.address,     binding.driver,      binding.override,
                        binding.was_on_vfio, std::move(identity), binding.vfio_driver};
}

std::string ClaimRecord::Display() const {
  return "claim " + namespace_ + "/" + name + " (uid " + uid + ")";
}

const VgpuRecord* FindVgpu(const ClaimRecord& record, const std::string& address) {
  for (const VgpuRecord& v : record.vgpus) {
    if (v.address == address) return &v;
  }
  return nullptr;
}

const ClaimRecord* CheckpointView::Find(const std::string& uid) const {
  auto it = claims.find(uid);
  return it == claims.end() ? nullptr : it->second.get();
}

std::vector<PreparedTarget> PreparedTargets(const CheckpointView& view) {
  std::vector<PreparedTarget> out;
  for (const auto& [uid, shared] : view.claims) {
    const ClaimRecord& record = *shared;
    if (record.state != PrepareState::kPrepareCompleted) continue;
    for (const RecordedDevice& device : record.devices) {
      PreparedTarget target;
      target.claim = record.namespace_ + "/" + record.name;
      target.pool = device.pool;
      target.device = device.device;
      target.attributes = device.attributes;
      if (device.is_mdev) {
        target.mdev_uuid = device.mdev.uuid;
      } else if (device.is_vgpu) {
        target.vgpu_vf = device.address;
        target.vgpu_type = device.vgpu_type;
      } else {
        target.functions = device.functions;
        for (const FunctionRecord& f : record.functions) {
          target.vfio_drivers[f.address] = f.vfio_driver;
        }
      }
      out.push_back(std::move(target));
    }
  }
  return out;
}

std::map<std::string, discovery::ManagedFunction> ManagedFunctions(const CheckpointView& view) {
  std::map<std::string, discovery::ManagedFunction> out;
  for (const auto& [uid, record] : view.claims) {
    for (const FunctionRecord& f : record->functions) {
      out.emplace(f.address, discovery::ManagedFunction{f.driver, f.vfio_driver});
    }
  }
  return out;
}

}  // namespace vfio_dra::prepare
