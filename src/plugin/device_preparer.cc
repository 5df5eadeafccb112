#include "plugin/device_preparer.h"

namespace vfio_dra::plugin {

Result<std::vector<PreparedDevice>> UnimplementedDevicePreparer::Prepare(
    const kube::ResourceClaim& claim,
    const std::vector<kube::DeviceRequestAllocationResult>& ours) {
  std::string devices;
  for (const auto& result : ours) {
    if (!devices.empty()) devices += ", ";
    devices += result.pool + "/" + result.device;
  }
  return MakeError(ErrorKind::kUnimplemented,
                   "claim " + claim.namespace_ + "/" + claim.name + ": device preparation (" +
                       devices + ") is not implemented yet in this build of vfio-dra-plugin");
}

Status UnimplementedDevicePreparer::Unprepare(const ClaimRef& /*claim*/) { return Status::Ok(); }

}  // namespace vfio_dra::plugin
