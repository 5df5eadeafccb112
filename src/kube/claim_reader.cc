#include "kube/claim_reader.h"

namespace vfio_dra::kube {

std::string ResourceClaimReader::ServedVersion() const {
  std::lock_guard<std::mutex> lock(mu_);
  return served_version_;
}

Result<ResourceClaim> ResourceClaimReader::Get(const std::string& namespace_,
                                               const std::string& name, Deadline deadline) {
  const std::string what = "ResourceClaim " + namespace_ + "/" + name;
  std::string unserved;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto served = versions_.Served(deadline);
    if (!served.ok()) return served.error().Wrap("cannot get " + what);
    if (served->empty() || served->front() == unserved) break;
    const std::string& version = served->front();
    const std::string path = "/apis/resource.k8s.io/" + version + "/namespaces/" +
                             UrlEncode(namespace_) + "/resourceclaims/" + UrlEncode(name);
    auto response = client_.Call("GET", path, nullptr, deadline);
    if (!response.ok()) return response.error().Wrap("cannot get " + what);
    if (response->status == 200) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        served_version_ = version;
      }
      auto claim = ParseResourceClaim(response->body);
      if (!claim.ok()) return claim.error().Wrap("cannot parse " + what);
      return claim;
    }
    if (response->status == 404) {
      const ApiStatus status = ParseApiStatus(*response);
      // A Status naming the resource means the version is served and the object is missing;
      // a bare 404 page means this API version is no longer served here: discover again.
      if (status.reason == "NotFound" && !status.details_kind.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        served_version_ = version;
        return MakeError(ErrorKind::kNotFound, what + " not found (" + status.message + ")");
      }
      unserved = version;
      versions_.Forget();
      continue;
    }
    Error error = ApiErrorFromResponse("GET", path, *response).Wrap("cannot get " + what);
    AddRbacHint(error, *response, "get on resourceclaims");
    return error;
  }
  return MakeError(ErrorKind::kNotFound,
                   "cannot get " + what +
                       ": the API server serves none of resource.k8s.io v1, v1beta2, v1beta1 "
                       "(is DynamicResourceAllocation enabled?)");
}

}  // namespace vfio_dra::kube
