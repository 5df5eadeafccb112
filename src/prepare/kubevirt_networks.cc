#include "prepare/kubevirt_networks.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/text.h"
#include "prepare/vfio_config.h"

namespace vfio_dra::prepare {
namespace {

Error Malformed(const std::string& text, const std::string& why) {
  return MakeError(ErrorKind::kInvalidArgument,
                   std::string("annotation ") + kKubevirtDraNetworksAnnotation + " " +
                       EscapeForDisplay(text, 300) + " is malformed: " + why);
}

Result<std::string> RequiredString(const nlohmann::json& entry, const char* key,
                                   const std::string& text, size_t index) {
  auto it = entry.find(key);
  if (it == entry.end() || !it->is_string() || it->get<std::string>().empty()) {
    return Malformed(
        text, "entry " + std::to_string(index) + " needs a non-empty string \"" + key + "\"");
  }
  return it->get<std::string>();
}

}  // namespace

Result<std::vector<KubevirtNetworkRequest>> ParseKubevirtNetworks(const std::string& text) {
  auto json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded()) return Malformed(text, "it is not JSON");
  if (!json.is_array()) return Malformed(text, "it is not a JSON list");
  std::vector<KubevirtNetworkRequest> out;
  std::set<std::pair<std::string, std::string>> seen;
  for (size_t i = 0; i < json.size(); ++i) {
    const nlohmann::json& entry = json[i];
    if (!entry.is_object()) return Malformed(text, "entry " + std::to_string(i) + " is no object");
    KubevirtNetworkRequest request;
    auto claim = RequiredString(entry, "claimName", text, i);
    if (!claim.ok()) return claim.error();
    auto name = RequiredString(entry, "requestName", text, i);
    if (!name.ok()) return name.error();
    request.claim_name = *claim;
    request.request_name = *name;
    if (auto mac = entry.find("mac"); mac != entry.end() && !mac->is_null()) {
      auto parsed = mac->is_string() ? UnicastMac(mac->get<std::string>()) : std::nullopt;
      if (!parsed) {
        return Malformed(text, "entry " + std::to_string(i) + " has mac " +
                                   EscapeForDisplay(mac->dump(), 40) +
                                   ", not a unicast MAC address like \"02:00:00:aa:bb:cc\"");
      }
      request.mac = *parsed;
    }
    if (!seen.insert({request.claim_name, request.request_name}).second) {
      return Malformed(text, "claim \"" + request.claim_name + "\" request \"" +
                                 request.request_name + "\" is named twice");
    }
    out.push_back(std::move(request));
  }
  return out;
}

Result<std::map<std::string, std::string>> KubevirtNetworkRequests::MacsFor(
    const kube::ResourceClaim& claim, Deadline deadline) const {
  std::map<std::string, std::string> macs;
  if (pods_ == nullptr) return macs;
  std::map<std::string, std::string> asked_by;  // request -> pod, for conflicts
  for (const kube::ResourceClaimConsumerReference& consumer : claim.reserved_for) {
    if (!consumer.IsPod()) continue;
    const std::string who = "pod " + claim.namespace_ + "/" + consumer.name;
    auto pod = pods_->Get(claim.namespace_, consumer.name, deadline);
    if (!pod.ok()) {
      return pod.error().Wrap("cannot read " + who + ", which uses the claim, for its " +
                              kKubevirtDraNetworksAnnotation + " annotation");
    }
    if (!consumer.uid.empty() && pod->uid != consumer.uid) continue;  // a newer pod of that name
    auto annotation = pod->annotations.find(kKubevirtDraNetworksAnnotation);
    if (annotation == pod->annotations.end()) continue;
    // A template claim knows the pod's name for it; an existing claim is found in the pod's spec.
    std::optional<std::string> pod_claim_name = pod->PodClaimNameOf(claim.name);
    if (auto it = claim.annotations.find(kube::kPodClaimNameAnnotation);
        it != claim.annotations.end()) {
      pod_claim_name = it->second;
    }
    if (!pod_claim_name) continue;
    auto requests = ParseKubevirtNetworks(annotation->second);
    if (!requests.ok()) return requests.error().Wrap(who);
    for (const KubevirtNetworkRequest& request : *requests) {
      if (request.claim_name != *pod_claim_name || !request.mac) continue;
      auto [it, added] = macs.emplace(request.request_name, *request.mac);
      if (!added && it->second != *request.mac) {
        return MakeError(ErrorKind::kInvalidArgument,
                         who + " asks MAC " + *request.mac + " for request " +
                             request.request_name + " of claim " + claim.namespace_ + "/" +
                             claim.name + ", and " + asked_by[request.request_name] + " asks " +
                             it->second + "; a shared claim's VF can have only one");
      }
      asked_by[request.request_name] = who;
    }
  }
  return macs;
}

}  // namespace vfio_dra::prepare
