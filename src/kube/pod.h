// Pod: the parts of a core/v1 Pod that vfio-dra reads when it prepares a claim for it: its
// annotations (KubeVirt's kubevirt.io/dra-networks) and how the pod names its claims
// (spec.resourceClaims[], status.resourceClaimStatuses[]). Parsing is strict about types: a field
// of the wrong type is an error naming the field, never a crash.
//
// PodReader GETs one pod. It is only called for claims that need it (SR-IOV VFs of network PFs),
// so a node that hands out GPUs never reads a pod.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/result.h"
#include "kube/api_client.h"

namespace vfio_dra::kube {

// spec.resourceClaims[]: the pod's own name for a claim, and where the claim comes from.
struct PodResourceClaim {
  std::string name;                                         // the pod's claim name
  std::optional<std::string> resource_claim_name;           // an existing claim
  std::optional<std::string> resource_claim_template_name;  // a claim generated from a template
};

// status.resourceClaimStatuses[]: the claim generated for a template claim.
struct PodResourceClaimStatus {
  std::string name;                                // the pod's claim name
  std::optional<std::string> resource_claim_name;  // absent when no claim was needed
};

struct Pod {
  std::string namespace_;
  std::string name;
  std::string uid;
  std::map<std::string, std::string> annotations;
  std::vector<PodResourceClaim> resource_claims;
  std::vector<PodResourceClaimStatus> resource_claim_statuses;

  // The pod's name for the ResourceClaim called `claim_name`: through spec.resourceClaims[]
  // (resourceClaimName) or status.resourceClaimStatuses[] (template claims); nullopt when the pod
  // does not refer to it.
  std::optional<std::string> PodClaimNameOf(const std::string& claim_name) const;
};

Result<Pod> ParsePod(const nlohmann::json& object);

// Reads pods; an interface so that preparation can be tested without an API server.
class PodReader {
 public:
  virtual ~PodReader() = default;
  // kNotFound when the pod does not exist; other kinds for server or transport failures.
  // Retries stop at `deadline`.
  virtual Result<Pod> Get(const std::string& namespace_, const std::string& name,
                          Deadline deadline) = 0;
};

// GET /api/v1/namespaces/<ns>/pods/<name>.
class ApiPodReader final : public PodReader {
 public:
  explicit ApiPodReader(ApiClient& client) : client_(client) {}
  Result<Pod> Get(const std::string& namespace_, const std::string& name,
                  Deadline deadline) override;

 private:
  ApiClient& client_;
};

}  // namespace vfio_dra::kube
