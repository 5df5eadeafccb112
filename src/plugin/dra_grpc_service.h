// DraGrpcService<Api>: the gRPC face of DraNodeService for one DRA API version. v1 and v1beta1
// are wire-identical apart from Device.share_id (v1 only), so one template converts both to and
// from the plain types of DraNodeService; the daemon serves one instance per version.
#pragma once

#include <atomic>
#include <string>
#include <type_traits>
#include <vector>

#include "base/deadline.h"
#include "base/log.h"
#include "dra_v1.pb.h"
#include "dra_v1beta1.pb.h"
#include "plugin/grpc_method.h"
#include "plugin/node_service.h"

namespace vfio_dra::plugin {

struct DraV1Api {
  // The gRPC service name is the proto package's; "v1.DRAPlugin" is only what registration
  // advertises.
  static constexpr const char* kServicePath = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/";
  using PrepareRequest = k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesRequest;
  using PrepareResponse = k8s::io::kubelet::pkg::apis::dra::v1::NodePrepareResourcesResponse;
  using UnprepareRequest = k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesRequest;
  using UnprepareResponse = k8s::io::kubelet::pkg::apis::dra::v1::NodeUnprepareResourcesResponse;
  static constexpr bool kHasShareId = true;
  static constexpr const char* kName = "v1";
};

struct DraV1beta1Api {
  static constexpr const char* kServicePath = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/";
  using PrepareRequest = k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesRequest;
  using PrepareResponse = k8s::io::kubelet::pkg::apis::dra::v1beta1::NodePrepareResourcesResponse;
  using UnprepareRequest = k8s::io::kubelet::pkg::apis::dra::v1beta1::NodeUnprepareResourcesRequest;
  using UnprepareResponse =
      k8s::io::kubelet::pkg::apis::dra::v1beta1::NodeUnprepareResourcesResponse;
  static constexpr bool kHasShareId = false;
  static constexpr const char* kName = "v1beta1";
};

template <typename Api>
class DraGrpcService final {
 public:
  DraGrpcService(DraNodeService& node, Logger log) : node_(node), log_(std::move(log)) {}

  std::vector<GrpcMethod> Methods() {
    return {UnaryMethod<typename Api::PrepareRequest, typename Api::PrepareResponse>(
                std::string(Api::kServicePath) + "NodePrepareResources",
                [this](const auto& request, CallContext& context, auto* response) {
                  return NodePrepareResources(context, &request, response);
                }),
            UnaryMethod<typename Api::UnprepareRequest, typename Api::UnprepareResponse>(
                std::string(Api::kServicePath) + "NodeUnprepareResources",
                [this](const auto& request, CallContext& context, auto* response) {
                  return NodeUnprepareResources(context, &request, response);
                })};
  }

  GrpcStatus NodePrepareResources(const CallContext& context,
                                  const typename Api::PrepareRequest* request,
                                  typename Api::PrepareResponse* response) {
    const std::string id = NextRequestId();
    log_.Debug(4, "gRPC NodePrepareResources",
               {{"api", Api::kName},
                {"request_id", id},
                {"claims", std::to_string(request->claims_size())}});
    auto results = node_.Prepare(ToRefs(request->claims()), AnswerBy(context));
    if (!results.ok()) {
      log_.Error("rejected NodePrepareResources",
                 {{"request_id", id}, {"error", results.error().message}});
      return GrpcStatus{GrpcCode::kInvalidArgument, results.error().message};
    }
    for (auto& [uid, result] : *results) {
      auto& entry = (*response->mutable_claims())[uid];
      entry.set_error(result.error);
      if (!result.error.empty()) continue;
      for (const prepare::PreparedDevice& device : result.devices) {
        auto* pb = entry.add_devices();
        for (const std::string& name : device.request_names) pb->add_request_names(name);
        pb->set_pool_name(device.pool_name);
        pb->set_device_name(device.device_name);
        for (const std::string& cdi : device.cdi_device_ids) pb->add_cdi_device_ids(cdi);
        if constexpr (Api::kHasShareId) {
          if (device.share_id.has_value()) pb->set_share_id(*device.share_id);
        }
      }
    }
    log_.Debug(4, "gRPC NodePrepareResources done", {{"api", Api::kName}, {"request_id", id}});
    return GrpcStatus::Ok();
  }

  GrpcStatus NodeUnprepareResources(const CallContext& context,
                                    const typename Api::UnprepareRequest* request,
                                    typename Api::UnprepareResponse* response) {
    const std::string id = NextRequestId();
    log_.Debug(4, "gRPC NodeUnprepareResources",
               {{"api", Api::kName},
                {"request_id", id},
                {"claims", std::to_string(request->claims_size())}});
    auto results = node_.Unprepare(ToRefs(request->claims()), AnswerBy(context));
    if (!results.ok()) {
      log_.Error("rejected NodeUnprepareResources",
                 {{"request_id", id}, {"error", results.error().message}});
      return GrpcStatus{GrpcCode::kInvalidArgument, results.error().message};
    }
    for (auto& [uid, result] : *results) {
      (*response->mutable_claims())[uid].set_error(result.error);
    }
    log_.Debug(4, "gRPC NodeUnprepareResources done", {{"api", Api::kName}, {"request_id", id}});
    return GrpcStatus::Ok();
  }

 private:
  // The kubelet's deadline (45 s in every release) less a margin for sending the answer: work
  // that would finish after it is wasted, and retries would pile up behind the node lock.
  static Deadline AnswerBy(const CallContext& context) {
    const auto at = context.deadline();
    if (!at) return {};  // no deadline set
    const auto left = *at - std::chrono::steady_clock::now();
    if (left > std::chrono::hours(24)) return {};
    const auto margin =
        std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(2), left / 10);
    return Deadline(*at - margin);
  }

  template <typename Claims>
  static std::vector<prepare::ClaimRef> ToRefs(const Claims& claims) {
    std::vector<prepare::ClaimRef> refs;
    refs.reserve(static_cast<size_t>(claims.size()));
    for (const auto& c : claims) {
      refs.push_back(prepare::ClaimRef{c.namespace_(), c.name(), c.uid()});
    }
    return refs;
  }
  std::string NextRequestId() { return std::string(Api::kName) + "-" + std::to_string(++counter_); }

  DraNodeService& node_;
  Logger log_;
  std::atomic<unsigned long long> counter_{0};
};

}  // namespace vfio_dra::plugin
