// ClaimStatusWriter: writes what a driver reports about its allocated devices into a
// ResourceClaim's status.devices[] (KEP-4817: conditions, opaque data, networkData).
//
// The API server keeps status.devices as a map keyed by (driver, pool, device, shareID) and other
// drivers of the same claim write their own entries, so this never reads and writes back the list:
// it uses server-side apply on the status subresource with the driver name as field manager.
// Applying a set of entries replaces exactly the entries this driver applied before for that claim
// (entries it no longer lists are removed, others' are untouched); applying an empty set removes
// all of ours. What makes entries "ours" is that field manager, not the process: a restarted
// instance, or the next one of a rolling update, replaces and removes what an earlier one applied.
//
// Every apply can carry the claim's resourceVersion as a precondition (a 409 when the claim
// changed since it was read), so that a decision taken on an older reading of the claim never
// lands over a newer one; Read gives the reading to decide on.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/result.h"
#include "kube/api_client.h"
#include "kube/resource_api_versions.h"
#include "kube/resource_claim.h"

namespace vfio_dra::kube {

// The claim a status write is for: uid is sent as a precondition so that a claim deleted and
// re-created under the same name is never written to.
struct ClaimStatusTarget {
  std::string api_version;  // as read, e.g. "resource.k8s.io/v1"; empty: not known
  std::string namespace_;
  std::string name;
  std::string uid;
  // The claim as the write was decided on: sent as a precondition. Empty: none (the uid only).
  std::string resource_version;
};

// The claim as a status write decides on it.
struct ClaimStatusReading {
  std::string api_version;       // the version that served it, e.g. "resource.k8s.io/v1beta2"
  std::string resource_version;  // the precondition for a write decided on this reading
  std::vector<AllocatedDeviceStatus> ours;  // this driver's status.devices entries
};

class ClaimStatusWriter {
 public:
  virtual ~ClaimStatusWriter() = default;
  // Replaces this driver's entries of the claim's status.devices with `devices` (empty: removes
  // them). kNotFound when the claim is gone (or was replaced: uid mismatch); other kinds for
  // server or transport failures, with the server's message (a 403 names the missing RBAC).
  // kConflict when claim.resource_version is set and the claim changed since (read it again).
  // kFailedPrecondition when the server does not serve claim.api_version.
  virtual Status Apply(const ClaimStatusTarget& claim,
                       const std::vector<AllocatedDeviceStatus>& devices, Deadline deadline) = 0;
  // Reads the claim in claim.api_version, or when that is empty or not served, in the newest
  // version the server serves. kNotFound when the claim is gone or was replaced (another uid).
  virtual Result<ClaimStatusReading> Read(const ClaimStatusTarget& claim, Deadline deadline) = 0;
};

// Whether two sets of entries say the same (order aside): a write of `want` over `shown` would
// change nothing.
bool SameDeviceStatuses(const std::vector<AllocatedDeviceStatus>& shown,
                        const std::vector<AllocatedDeviceStatus>& want);

// Server-side apply: PATCH .../namespaces/<ns>/resourceclaims/<name>/status with
// Content-Type application/apply-patch+yaml, ?fieldManager=<driver>&force=true.
class ApiClaimStatusWriter final : public ClaimStatusWriter {
 public:
  ApiClaimStatusWriter(ApiClient& client, ResourceApiVersions& versions, std::string driver)
      : client_(client), versions_(versions), driver_(std::move(driver)) {}
  Status Apply(const ClaimStatusTarget& claim, const std::vector<AllocatedDeviceStatus>& devices,
               Deadline deadline) override;
  // GET .../namespaces/<ns>/resourceclaims/<name> in the claim's version (InServedVersion), and
  // on a bare 404 in the other versions the server's discovery lists, newest first.
  Result<ClaimStatusReading> Read(const ClaimStatusTarget& claim, Deadline deadline) override;

 private:
  // Maps the server's answer: 404 to kNotFound, 409 to kConflict (a resourceVersion was sent) or
  // kNotFound (only the uid was: the claim was replaced), the rest to errors carrying the
  // server's message.
  Status ApplyResponseStatus(const ClaimStatusTarget& claim, const std::string& path,
                             const ApiResponse& response) const;

  // `claim` addressed in its own version when that is v1 (the newest; a server without it answers
  // a bare 404) or one the server serves, else in the newest the server serves: a claim recorded
  // in v1beta1 before the cluster's upgrade to 1.38 is written in v1, never in the removed v1beta1.
  Result<ClaimStatusTarget> InServedVersion(const ClaimStatusTarget& claim, Deadline deadline);
  // The reading in claim.api_version; nullopt for a bare 404 (the version is not served).
  std::optional<Result<ClaimStatusReading>> ReadIn(const ClaimStatusTarget& claim,
                                                   Deadline deadline);

  ApiClient& client_;
  ResourceApiVersions& versions_;
  std::string driver_;
};

// The apply body (exposed for tests).
nlohmann::json ClaimStatusApplyBody(const ClaimStatusTarget& claim,
                                    const std::vector<AllocatedDeviceStatus>& devices);
// The same, with `now` as the lastTransitionTime of conditions that have none.
nlohmann::json ClaimStatusApplyBody(const ClaimStatusTarget& claim,
                                    const std::vector<AllocatedDeviceStatus>& devices,
                                    std::chrono::system_clock::time_point now);

// The claim in its own API version (resource.k8s.io/v1 when claim.api_version is empty), without
// query. kInvalidArgument for another group or no name.
Result<std::string> ClaimPath(const ClaimStatusTarget& claim);
// Its status subresource.
Result<std::string> ClaimStatusPath(const ClaimStatusTarget& claim);

// Checks entries against what the API server enforces for status.devices (driver, pool and
// device set, unique keys, at most 8 conditions with type, status True/False/Unknown and reason,
// data a JSON object of at most 10 KiB, networkData limits) so that a bad entry fails before the
// request, naming its device, instead of as a 422 for the whole claim.
Status ValidateAllocatedDeviceStatuses(const std::vector<AllocatedDeviceStatus>& devices);

// "2026-11-25T10:00:00Z": metav1.Time's wire form (RFC 3339, UTC, whole seconds).
std::string FormatRfc3339(std::chrono::system_clock::time_point time);

}  // namespace vfio_dra::kube
