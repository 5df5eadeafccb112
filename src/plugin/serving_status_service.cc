#include "plugin/serving_status_service.h"

namespace vfio_dra::plugin {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

std::vector<GrpcMethod> ServingStatusService::Methods() {
  return {UnaryMethod<HealthCheckRequest, HealthCheckResponse>(
              "/grpc.health.v1.Health/Check",
              [this](const HealthCheckRequest& request, CallContext& /*context*/,
                     HealthCheckResponse* response) { return Check(request, response); }),
          ServerStreamingMethod<HealthCheckRequest, HealthCheckResponse>(
              "/grpc.health.v1.Health/Watch",
              [this](const HealthCheckRequest& request, CallContext& context,
                     StreamWriter<HealthCheckResponse>& writer) {
                return Watch(context, request, writer);
              })};
}

GrpcStatus ServingStatusService::Check(const HealthCheckRequest& request,
                                       HealthCheckResponse* response) {
  if (!request.service().empty()) {
    return GrpcStatus{GrpcCode::kNotFound,
                      "unknown service \"" + request.service() +
                          "\": this socket reports health only for the server as a whole "
                          "(service \"\")"};
  }
  std::lock_guard<std::mutex> lock(mu_);
  response->set_status(shut_down_ ? HealthCheckResponse::NOT_SERVING
                                  : HealthCheckResponse::SERVING);
  return GrpcStatus::Ok();
}

GrpcStatus ServingStatusService::Watch(const CallContext& context,
                                       const HealthCheckRequest& request,
                                       StreamWriter<HealthCheckResponse>& writer) {
  HealthCheckResponse response;
  if (!request.service().empty()) {
    // The protocol answers a watch of an unknown service with SERVICE_UNKNOWN and keeps the
    // stream open (the service might appear later; here it never does).
    response.set_status(HealthCheckResponse::SERVICE_UNKNOWN);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    response.set_status(shut_down_ ? HealthCheckResponse::NOT_SERVING
                                   : HealthCheckResponse::SERVING);
  }
  if (!writer.Write(response)) return GrpcStatus::Ok();
  context.OnCancel([this] {
    std::lock_guard<std::mutex> lock(mu_);
    changed_.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return shut_down_ || context.IsCancelled(); });
  if (!shut_down_) return GrpcStatus{GrpcCode::kCancelled, "the caller went away"};
  if (request.service().empty()) {
    lock.unlock();
    response.set_status(HealthCheckResponse::NOT_SERVING);
    writer.Write(response);
  }
  return GrpcStatus::Ok();
}

void ServingStatusService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
  }
  changed_.notify_all();
}

}  // namespace vfio_dra::plugin
