// ResourceClaimReader: GETs a ResourceClaim in the newest resource.k8s.io version the server
// serves, as its discovery document says (ResourceApiVersions, read once), so a 1.32/1.33 cluster
// is read in v1beta1/v1beta2 and a 1.38 one, which removed v1beta1 claims, is never asked for them.
// A bare 404 (the server was upgraded under us) makes it look at discovery again, once per call.
#pragma once

#include <mutex>
#include <string>

#include "kube/api_client.h"
#include "kube/resource_api_versions.h"
#include "kube/resource_claim.h"

namespace vfio_dra::kube {

class ResourceClaimReader {
 public:
  ResourceClaimReader(ApiClient& client, ResourceApiVersions& versions)
      : client_(client), versions_(versions) {}

  // kNotFound when the claim does not exist (or no known API version is served; the message
  // tells which); other kinds for server or transport failures.
  // Retries stop at `deadline`.
  Result<ResourceClaim> Get(const std::string& namespace_, const std::string& name,
                            Deadline deadline = {});

  // The API version in use, e.g. "v1"; empty until a call succeeded.
  std::string ServedVersion() const;

 private:
  ApiClient& client_;
  ResourceApiVersions& versions_;
  mutable std::mutex mu_;
  std::string served_version_;
};

}  // namespace vfio_dra::kube
