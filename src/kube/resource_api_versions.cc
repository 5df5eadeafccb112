#include "kube/resource_api_versions.h"

#include <array>
#include <set>

namespace vfio_dra::kube {
namespace {

constexpr std::array<const char*, 3> kKnownVersions = {"v1", "v1beta2", "v1beta1"};
constexpr const char* kGroupPath = "/apis/resource.k8s.io";

}  // namespace

Result<std::vector<std::string>> ResourceApiVersions::Served(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (served_) return *served_;
  }
  auto response = client_.Call("GET", kGroupPath, nullptr, deadline);
  if (!response.ok()) return response.error().Wrap("cannot discover the resource.k8s.io API");
  std::set<std::string> listed;
  if (response->status == 200 && response->body.is_object()) {
    const nlohmann::json versions = response->body.value("versions", nlohmann::json::array());
    for (const nlohmann::json& v : versions) {
      if (v.is_object() && v.contains("version") && v["version"].is_string()) {
        listed.insert(v["version"].get<std::string>());
      }
    }
  } else if (response->status != 404) {
    return ApiErrorFromResponse("GET", kGroupPath, *response)
        .Wrap("cannot discover the resource.k8s.io API");
  }
  std::vector<std::string> served;
  for (const char* version : kKnownVersions) {
    if (listed.count(version) != 0) served.emplace_back(version);
  }
  std::string text;
  for (const std::string& version : served) text += (text.empty() ? "" : ",") + version;
  client_.log().Info("resource.k8s.io versions for claims",
                     {{"served", text.empty() ? "none" : text},
                      {"chosen", served.empty() ? "none" : "resource.k8s.io/" + served.front()}});
  std::lock_guard<std::mutex> lock(mu_);
  served_ = served;
  return served;
}

void ResourceApiVersions::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  served_.reset();
}

}  // namespace vfio_dra::kube
