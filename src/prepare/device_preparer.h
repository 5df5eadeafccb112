// DevicePreparer: the seam between the kubelet-facing service and the device work (vfio binding,
// mdev creation, CDI specs, checkpoint). With ClaimRef and DeviceHealthStatus it is all that
// src/plugin sees of src/prepare. The node service does the protocol (claim lookup,
// validation, filtering to our driver, serialization); a DevicePreparer only sees claims that are
// valid, allocated, and have results for this driver.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/result.h"
#include "kube/resource_claim.h"
#include "prepare/claim_ref.h"

namespace vfio_dra::prepare {

struct PreparedDevice {
  std::vector<std::string> request_names;  // base names ("req", never "req/sub")
  std::string pool_name;
  std::string device_name;
  std::vector<std::string> cdi_device_ids;
  std::optional<std::string> share_id;
};

// One device's verdict for the kubelet's health stream (see device_health.h for the rules).
struct DeviceHealthStatus {
  std::string pool;
  std::string device;
  bool healthy = true;
  std::string message;  // why it is unhealthy; a short description when healthy
};

class DevicePreparer {
 public:
  virtual ~DevicePreparer() = default;
  // Prepares every result in `ours` (all of them for this driver). Must be idempotent: the kubelet
  // repeats the call until it sees success. Called under the node-wide lock unless the preparer
  // orders its own device work (then calls for different claims arrive concurrently); answers by
  // `deadline` (an error then, which the kubelet's retry picks up).
  virtual Result<std::vector<PreparedDevice>> Prepare(
      const kube::ResourceClaim& claim,
      const std::vector<kube::DeviceRequestAllocationResult>& ours, Deadline deadline) = 0;
  // Undoes whatever Prepare did for the claim; works from the reference alone (the claim may be
  // gone from the API) and succeeds when there is nothing to undo. Same lock and deadline rules.
  virtual Status Unprepare(const ClaimRef& claim, Deadline deadline) = 0;
};

}  // namespace vfio_dra::prepare
