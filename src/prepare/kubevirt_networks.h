// KubeVirt's request for the MACs of SR-IOV interfaces backed by DRA devices (VEP-10): the
// virt-launcher pod carries
//   kubevirt.io/dra-networks: '[{"claimName":"sriov","requestName":"vf","mac":"02:..:ef"}]'
// where claimName is the pod's name for the claim (pod.spec.resourceClaims[].name) and
// requestName the claim's request. The MAC it names wins over VfioConfig.macAddress, because it is
// what the VM's owner wrote in the VMI.
//
// Parsing tolerates fields it does not know (KubeVirt may add some) but nothing malformed: a
// malformed annotation fails the claim with an error that quotes it, since guessing would give the
// VM another MAC than the one asked for.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/result.h"
#include "kube/pod.h"
#include "kube/resource_claim.h"

namespace vfio_dra::prepare {

inline constexpr const char* kKubevirtDraNetworksAnnotation = "kubevirt.io/dra-networks";

struct KubevirtNetworkRequest {
  std::string claim_name;          // the pod's name for the claim
  std::string request_name;        // the claim's request
  std::optional<std::string> mac;  // lower case
};

// The annotation's entries; an error quoting the text when it is not a list of such objects or a
// pair (claimName, requestName) is named twice.
Result<std::vector<KubevirtNetworkRequest>> ParseKubevirtNetworks(const std::string& text);

// What the pods that use `claim` ask for its requests: request name -> MAC. Reads each pod in
// status.reservedFor (pods only); a pod that does not name the claim, or has no annotation, asks
// for nothing. Two pods asking different MACs for one request is an error.
class KubevirtNetworkRequests {
 public:
  explicit KubevirtNetworkRequests(kube::PodReader* pods) : pods_(pods) {}

  // Request name (base, without "/sub") -> MAC.
  Result<std::map<std::string, std::string>> MacsFor(const kube::ResourceClaim& claim,
                                                     Deadline deadline) const;

 private:
  kube::PodReader* pods_;  // null: no API server (nothing is asked for)
};

}  // namespace vfio_dra::prepare
