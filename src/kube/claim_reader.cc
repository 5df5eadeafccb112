#include "kube/claim_reader.h"

#include <array>

namespace vfio_dra::kube {
namespace {

constexpr std::array<const char*, 3> kVersions = {"v1", "v1beta2", "v1beta1"};

}  // namespace

std::string ResourceClaimReader::ServedVersion() const {
  const int index = version_index_.load();
  return index < 0 ? std::string() : kVersions[static_cast<size_t>(index)];
}

Result<ResourceClaim> ResourceClaimReader::Get(const std::string& namespace_,
                                               const std::string& name, Deadline deadline) {
  const std::string what = "ResourceClaim " + namespace_ + "/" + name;
  const int remembered = version_index_.load();
  const int start = remembered < 0 ? 0 : remembered;
  for (int step = 0; step < static_cast<int>(kVersions.size()); ++step) {
    const int index = (start + step) % static_cast<int>(kVersions.size());
    const std::string path = std::string("/apis/resource.k8s.io/") + kVersions[index] +
                             "/namespaces/" + UrlEncode(namespace_) + "/resourceclaims/" +
                             UrlEncode(name);
    auto response = client_.Call("GET", path, nullptr, deadline);
    if (!response.ok()) return response.error().Wrap("cannot get " + what);
    if (response->status == 200) {
      version_index_.store(index);
      auto claim = ParseResourceClaim(response->body);
      if (!claim.ok()) return claim.error().Wrap("cannot parse " + what);
      return claim;
    }
    if (response->status == 404) {
      const ApiStatus status = ParseApiStatus(*response);
      // A Status naming the resource means the version is served and the object is missing;
      // a bare 404 page means this API version is not served here.
      if (status.reason == "NotFound" && !status.details_kind.empty()) {
        version_index_.store(index);
        return MakeError(ErrorKind::kNotFound, what + " not found (" + status.message + ")");
      }
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
