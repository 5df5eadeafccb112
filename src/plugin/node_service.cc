#include "plugin/node_service.h"

#include <chrono>
#include <optional>
#include <set>

namespace vfio_dra::plugin {

DraNodeService::DraNodeService(std::string driver_name, ClaimSource& claims,
                               prepare::DevicePreparer& preparer, CallSerializer* serializer,
                               Logger log, MetricsRegistry* metrics)
    : driver_name_(std::move(driver_name)),
      claims_(claims),
      preparer_(preparer),
      serializer_(serializer),
      log_(std::move(log)),
      metrics_(metrics) {}

void DraNodeService::Record(const char* operation, const std::string& error,
                            std::chrono::steady_clock::duration took) {
  if (metrics_ == nullptr) return;
  metrics_->Increment("vfio_dra_claims_total",
                      {{"operation", operation}, {"result", error.empty() ? "ok" : "error"}});
  metrics_->Observe("vfio_dra_claim_duration_seconds", {{"operation", operation}},
                    std::chrono::duration<double>(took).count());
}

Status DraNodeService::ValidateRequest(const std::vector<prepare::ClaimRef>& claims,
                                       const char* call) const {
  if (claims.size() > kMaxClaimsPerCall) {
    return MakeError(ErrorKind::kInvalidArgument,
                     std::string(call) + ": the request lists " + std::to_string(claims.size()) +
                         " claims; at most " + std::to_string(kMaxClaimsPerCall) +
                         " are accepted in one call");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < claims.size(); ++i) {
    const prepare::ClaimRef& claim = claims[i];
    if (claim.uid.empty()) {
      // Without a UID there is no key to answer under, so the whole request is malformed.
      return MakeError(ErrorKind::kInvalidArgument, std::string(call) + ": claim #" +
                                                        std::to_string(i) + " (" + claim.Display() +
                                                        ") has an empty uid");
    }
    if (!seen.insert(claim.uid).second) {
      return MakeError(ErrorKind::kInvalidArgument, std::string(call) + ": claim uid " +
                                                        EscapeForDisplay(claim.uid) +
                                                        " appears more than once in the request");
    }
  }
  return Status::Ok();
}

namespace {

std::string TooLate(const char* operation) {
  return std::string("not ") + operation +
         ": the kubelet's deadline for this call was reached before this claim's turn (earlier "
         "claims of the call, or device work of other pods, took the time); the kubelet retries";
}

}  // namespace

Result<std::map<std::string, ClaimPrepareResult>> DraNodeService::Prepare(
    const std::vector<prepare::ClaimRef>& claims, Deadline deadline) {
  if (metrics_ != nullptr) {
    metrics_->Increment("vfio_dra_requests_total", {{"method", "NodePrepareResources"}});
  }
  if (Status s = ValidateRequest(claims, "NodePrepareResources"); !s.ok()) return s.error();
  std::map<std::string, ClaimPrepareResult> out;
  for (const prepare::ClaimRef& ref : claims) {
    const auto start = std::chrono::steady_clock::now();
    ClaimPrepareResult result;
    if (deadline.Expired()) {
      result.error = "claim " + ref.Display() + " (uid " + ref.uid + "): " + TooLate("prepared");
    } else {
      result = PrepareOne(ref, deadline);
    }
    const std::chrono::duration<double, std::milli> elapsed =
        std::chrono::steady_clock::now() - start;
    const std::string took = std::to_string(elapsed.count());
    Record("prepare", result.error, std::chrono::steady_clock::now() - start);
    if (!result.error.empty()) {
      log_.Error(
          "prepare failed",
          {{"claim", ref.Display()}, {"uid", ref.uid}, {"error", result.error}, {"ms", took}});
    } else {
      log_.Info("prepared claim", {{"claim", ref.Display()},
                                   {"uid", ref.uid},
                                   {"devices", std::to_string(result.devices.size())},
                                   {"ms", took}});
    }
    out[ref.uid] = std::move(result);
  }
  return out;
}

ClaimPrepareResult DraNodeService::PrepareOne(const prepare::ClaimRef& ref, Deadline deadline) {
  ClaimPrepareResult result;
  if (Status s = prepare::ValidateClaimRef(ref); !s.ok()) {
    result.error = s.error().message;
    return result;
  }
  const std::string who = "claim " + ref.Display() + " (uid " + ref.uid + ")";
  // The claim is read before taking the serialization lock, as upstream does, so a slow API server
  // does not hold up device work for other pods.
  auto claim = claims_.Get(ref.namespace_, ref.name, deadline);
  if (!claim.ok()) {
    result.error = who + ": " + claim.error().message;
    return result;
  }
  if (claim->uid != ref.uid) {
    result.error = who + ": the ResourceClaim was replaced: the API server has uid " + claim->uid +
                   " for " + ref.Display();
    return result;
  }
  if (!claim->allocation.has_value()) {
    result.error = who + ": the ResourceClaim is not allocated (status.allocation is unset)";
    return result;
  }
  std::vector<kube::DeviceRequestAllocationResult> ours;
  for (const auto& r : claim->allocation->results) {
    if (r.driver == driver_name_) ours.push_back(r);
  }
  if (ours.empty()) {
    // The kubelet calls every driver that has results in the claim; none are ours, so there is
    // nothing to do and nothing to return.
    return result;
  }
  std::optional<CallSerializer::Guard> guard;
  if (serializer_ != nullptr) {
    auto acquired = serializer_->Acquire(deadline);
    if (!acquired.ok()) {
      result.error = who + ": not prepared: " + acquired.error().message;
      return result;
    }
    guard.emplace(std::move(*acquired));
  }
  auto devices = preparer_.Prepare(*claim, ours, deadline);
  if (!devices.ok()) {
    result.error = devices.error().message;
    return result;
  }
  result.devices = std::move(*devices);
  for (prepare::PreparedDevice& device : result.devices) {
    for (std::string& name : device.request_names) name = kube::BaseRequestName(name);
  }
  return result;
}

ClaimUnprepareResult DraNodeService::UnprepareOne(const prepare::ClaimRef& ref, Deadline deadline) {
  ClaimUnprepareResult result;
  if (Status s = prepare::ValidateClaimRef(ref); !s.ok()) {
    result.error = s.error().message;
    return result;
  }
  const std::string who = "claim " + ref.Display() + " (uid " + ref.uid + ")";
  if (deadline.Expired()) {
    result.error = who + ": " + TooLate("unprepared");
    return result;
  }
  std::optional<CallSerializer::Guard> guard;
  if (serializer_ != nullptr) {
    auto acquired = serializer_->Acquire(deadline);
    if (!acquired.ok()) {
      result.error = who + ": not unprepared: " + acquired.error().message;
      return result;
    }
    guard.emplace(std::move(*acquired));
  }
  if (Status u = preparer_.Unprepare(ref, deadline); !u.ok()) result.error = u.error().message;
  return result;
}

Result<std::map<std::string, ClaimUnprepareResult>> DraNodeService::Unprepare(
    const std::vector<prepare::ClaimRef>& claims, Deadline deadline) {
  if (metrics_ != nullptr) {
    metrics_->Increment("vfio_dra_requests_total", {{"method", "NodeUnprepareResources"}});
  }
  if (Status s = ValidateRequest(claims, "NodeUnprepareResources"); !s.ok()) return s.error();
  std::map<std::string, ClaimUnprepareResult> out;
  for (const prepare::ClaimRef& ref : claims) {
    const auto start = std::chrono::steady_clock::now();
    ClaimUnprepareResult result = UnprepareOne(ref, deadline);
    Record("unprepare", result.error, std::chrono::steady_clock::now() - start);
    if (result.error.empty()) {
      log_.Info("unprepared claim", {{"claim", ref.Display()}, {"uid", ref.uid}});
    } else {
      log_.Error("unprepare failed",
                 {{"claim", ref.Display()}, {"uid", ref.uid}, {"error", result.error}});
    }
    out[ref.uid] = std::move(result);
  }
  return out;
}

}  // namespace vfio_dra::plugin
