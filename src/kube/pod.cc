#include "kube/pod.h"

namespace vfio_dra::kube {
namespace {

Error FieldError(const std::string& field, const std::string& problem) {
  return MakeError(ErrorKind::kInvalidArgument, "Pod field " + field + " " + problem);
}

// An optional string member: missing or null gives nullopt.
Result<std::optional<std::string>> OptionalString(const nlohmann::json& object, const char* key,
                                                  const std::string& path) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return FieldError(path + "." + key, "must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

Result<std::string> RequiredString(const nlohmann::json& object, const char* key,
                                   const std::string& path) {
  auto value = OptionalString(object, key, path);
  if (!value.ok()) return value.error();
  if (!value->has_value() || (*value)->empty()) return FieldError(path + "." + key, "is required");
  return **value;
}

// Iterates over an optional list of objects, calling `each(entry, path)` for every element.
template <typename Each>
Status ForEachObject(const nlohmann::json& parent, const char* key, const std::string& path,
                     Each each) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return FieldError(path + "." + key, "must be a list");
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string entry_path = path + "." + key + "[" + std::to_string(i) + "]";
    if (!(*it)[i].is_object()) return FieldError(entry_path, "must be an object");
    Status status = each((*it)[i], entry_path);
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

// An optional object member: missing or null gives an empty object.
Result<const nlohmann::json*> OptionalObject(const nlohmann::json& parent, const char* key,
                                             const std::string& path) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return &kEmpty;
  if (!it->is_object()) {
    return FieldError(path.empty() ? key : path + "." + key, "must be an object");
  }
  return &*it;
}

Status ParseMetadata(const nlohmann::json& metadata, Pod& pod) {
  for (auto [key, target] : {std::pair{"namespace", &pod.namespace_}, std::pair{"name", &pod.name},
                             std::pair{"uid", &pod.uid}}) {
    auto value = OptionalString(metadata, key, "metadata");
    if (!value.ok()) return value.error();
    *target = value->value_or("");
  }
  auto annotations = OptionalObject(metadata, "annotations", "metadata");
  if (!annotations.ok()) return annotations.error();
  for (const auto& [key, value] : (*annotations)->items()) {
    if (!value.is_string()) {
      return FieldError("metadata.annotations[" + key + "]", "must be a string");
    }
    pod.annotations[key] = value.get<std::string>();
  }
  return Status::Ok();
}

Status ParseSpecClaims(const nlohmann::json& spec, Pod& pod) {
  return ForEachObject(spec, "resourceClaims", "spec",
                       [&](const nlohmann::json& entry, const std::string& path) -> Status {
                         PodResourceClaim claim;
                         auto name = RequiredString(entry, "name", path);
                         if (!name.ok()) return name.error();
                         claim.name = *name;
                         auto existing = OptionalString(entry, "resourceClaimName", path);
                         if (!existing.ok()) return existing.error();
                         claim.resource_claim_name = *existing;
                         auto from_template =
                             OptionalString(entry, "resourceClaimTemplateName", path);
                         if (!from_template.ok()) return from_template.error();
                         claim.resource_claim_template_name = *from_template;
                         pod.resource_claims.push_back(std::move(claim));
                         return Status::Ok();
                       });
}

Status ParseClaimStatuses(const nlohmann::json& status, Pod& pod) {
  return ForEachObject(status, "resourceClaimStatuses", "status",
                       [&](const nlohmann::json& entry, const std::string& path) -> Status {
                         PodResourceClaimStatus claim;
                         auto name = RequiredString(entry, "name", path);
                         if (!name.ok()) return name.error();
                         claim.name = *name;
                         auto generated = OptionalString(entry, "resourceClaimName", path);
                         if (!generated.ok()) return generated.error();
                         claim.resource_claim_name = *generated;
                         pod.resource_claim_statuses.push_back(std::move(claim));
                         return Status::Ok();
                       });
}

}  // namespace

std::optional<std::string> Pod::PodClaimNameOf(const std::string& claim_name) const {
  for (const PodResourceClaim& claim : resource_claims) {
    if (claim.resource_claim_name == claim_name) return claim.name;
  }
  for (const PodResourceClaimStatus& status : resource_claim_statuses) {
    if (status.resource_claim_name == claim_name) return status.name;
  }
  return std::nullopt;
}

Result<Pod> ParsePod(const nlohmann::json& object) {
  if (!object.is_object()) return FieldError("(object)", "must be a JSON object");
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) {
    return FieldError("metadata", "is missing or not an object");
  }
  Pod pod;
  if (Status status = ParseMetadata(*metadata, pod); !status.ok()) return status.error();
  auto spec = OptionalObject(object, "spec", "");
  if (!spec.ok()) return spec.error();
  if (Status status = ParseSpecClaims(**spec, pod); !status.ok()) return status.error();
  auto pod_status = OptionalObject(object, "status", "");
  if (!pod_status.ok()) return pod_status.error();
  if (Status status = ParseClaimStatuses(**pod_status, pod); !status.ok()) return status.error();
  return pod;
}

Result<Pod> ApiPodReader::Get(const std::string& namespace_, const std::string& name,
                              Deadline deadline) {
  const std::string what = "Pod " + namespace_ + "/" + name;
  const std::string path =
      "/api/v1/namespaces/" + UrlEncode(namespace_) + "/pods/" + UrlEncode(name);
  auto response = client_.Call("GET", path, nullptr, deadline);
  if (!response.ok()) return response.error().Wrap("cannot get " + what);
  if (response->status == 200) {
    auto pod = ParsePod(response->body);
    if (!pod.ok()) return pod.error().Wrap("cannot parse " + what);
    return pod;
  }
  if (response->status == 404) {
    return MakeError(ErrorKind::kNotFound,
                     what + " not found (" + ParseApiStatus(*response).message + ")");
  }
  Error error = ApiErrorFromResponse("GET", path, *response).Wrap("cannot get " + what);
  AddRbacHint(error, *response, "get on pods");
  return error;
}

}  // namespace vfio_dra::kube
