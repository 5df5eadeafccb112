// ClaimStatusWriter: writes what a driver reports about its allocated devices into a
// ResourceClaim's status.devices[] (KEP-4817: conditions, opaque data, networkData).
//
// The API server keeps status.devices as a map keyed by (driver, pool, device, shareID) and other
// drivers of the same claim write their own entries, so this never reads and writes back the list:
// it uses server-side apply on the status subresource with the driver name as field manager.
// Applying a set of entries replaces exactly the entries this driver applied before for that claim
// (entries it no longer lists are removed, others' are untouched); applying an empty set removes
// all of ours.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/result.h"
#include "kube/api_client.h"
#include "kube/resource_claim.h"

namespace vfio_dra::kube {

// The claim a status write is for: uid is sent as a precondition so that a claim deleted and
// re-created under the same name is never written to.
struct ClaimStatusTarget {
  std::string api_version;  // as read, e.g. "resource.k8s.io/v1"
  std::string namespace_;
  std::string name;
  std::string uid;
};

class ClaimStatusWriter {
 public:
  virtual ~ClaimStatusWriter() = default;
  // Replaces this driver's entries of the claim's status.devices with `devices` (empty: removes
  // them). kNotFound when the claim is gone (or was replaced: uid mismatch); other kinds for
  // server or transport failures, with the server's message (a 403 names the missing RBAC).
  virtual Status Apply(const ClaimStatusTarget& claim,
                       const std::vector<AllocatedDeviceStatus>& devices, Deadline deadline) = 0;
};

// Server-side apply: PATCH .../namespaces/<ns>/resourceclaims/<name>/status with
// Content-Type application/apply-patch+yaml, ?fieldManager=<driver>&force=true.
class ApiClaimStatusWriter final : public ClaimStatusWriter {
 public:
  ApiClaimStatusWriter(ApiClient& client, std::string driver)
      : client_(client), driver_(std::move(driver)) {}
  Status Apply(const ClaimStatusTarget& claim, const std::vector<AllocatedDeviceStatus>& devices,
               Deadline deadline) override;

 private:
  // Maps the server's answer: 404 and 409 (uid precondition) to kNotFound, the rest to errors
  // carrying the server's message.
  Status ApplyResponseStatus(const ClaimStatusTarget& claim, const std::string& path,
                             const ApiResponse& response) const;

  ApiClient& client_;
  std::string driver_;
};

// The apply body (exposed for tests).
nlohmann::json ClaimStatusApplyBody(const ClaimStatusTarget& claim,
                                    const std::vector<AllocatedDeviceStatus>& devices);
// The same, with `now` as the lastTransitionTime of conditions that have none.
nlohmann::json ClaimStatusApplyBody(const ClaimStatusTarget& claim,
                                    const std::vector<AllocatedDeviceStatus>& devices,
                                    std::chrono::system_clock::time_point now);

// The status subresource of the claim in its own API version (resource.k8s.io/v1 when
// claim.api_version is empty), without query. kInvalidArgument for another group or no name.
Result<std::string> ClaimStatusPath(const ClaimStatusTarget& claim);

// Checks entries against what the API server enforces for status.devices (driver, pool and
// device set, unique keys, at most 8 conditions with type, status True/False/Unknown and reason,
// data a JSON object of at most 10 KiB, networkData limits) so that a bad entry fails before the
// request, naming its device, instead of as a 422 for the whole claim.
Status ValidateAllocatedDeviceStatuses(const std::vector<AllocatedDeviceStatus>& devices);

// "2026-11-25T10:00:00Z": metav1.Time's wire form (RFC 3339, UTC, whole seconds).
std::string FormatRfc3339(std::chrono::system_clock::time_point time);

}  // namespace vfio_dra::kube
