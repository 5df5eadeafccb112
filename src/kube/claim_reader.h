// ResourceClaimReader: GETs a ResourceClaim in the newest resource.k8s.io version the server
// serves (v1, else v1beta2, else v1beta1) and remembers the version that worked, so a 1.32/1.33
// cluster costs one extra round trip once, not on every claim.
#pragma once

#include <atomic>
#include <string>

#include "kube/api_client.h"
#include "kube/resource_claim.h"

namespace vfio_dra::kube {

class ResourceClaimReader {
 public:
  explicit ResourceClaimReader(ApiClient& client) : client_(client) {}

  // kNotFound when the claim does not exist (or no known API version is served; the message
  // tells which); other kinds for server or transport failures.
  // Retries stop at `deadline`.
  Result<ResourceClaim> Get(const std::string& namespace_, const std::string& name,
                            Deadline deadline = {});

  // The API version in use, e.g. "v1"; empty until a call succeeded.
  std::string ServedVersion() const;

 private:
  ApiClient& client_;
  std::atomic<int> version_index_{-1};
};

}  // namespace vfio_dra::kube
