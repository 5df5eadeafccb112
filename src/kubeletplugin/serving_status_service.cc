#include "kubeletplugin/serving_status_service.h"

namespace vfio_dra::kubeletplugin {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

grpc::Status ServingStatusService::Check(grpc::ServerContext* /*context*/,
                                         const HealthCheckRequest* request,
                                         HealthCheckResponse* response) {
  if (!request->service().empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "unknown service \"" + request->service() +
                            "\": this socket reports health only for the server as a whole "
                            "(service \"\")");
  }
  std::lock_guard<std::mutex> lock(mu_);
  response->set_status(shut_down_ ? HealthCheckResponse::NOT_SERVING
                                  : HealthCheckResponse::SERVING);
  return grpc::Status::OK;
}

grpc::Status ServingStatusService::Watch(grpc::ServerContext* context,
                                         const HealthCheckRequest* request,
                                         grpc::ServerWriter<HealthCheckResponse>* writer) {
  HealthCheckResponse response;
  if (!request->service().empty()) {
    // The protocol answers a watch of an unknown service with SERVICE_UNKNOWN and keeps the
    // stream open (the service might appear later; here it never does).
    response.set_status(HealthCheckResponse::SERVICE_UNKNOWN);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    response.set_status(shut_down_ ? HealthCheckResponse::NOT_SERVING
                                   : HealthCheckResponse::SERVING);
  }
  if (!writer->Write(response)) return grpc::Status::OK;
  std::unique_lock<std::mutex> lock(mu_);
  while (!shut_down_) {
    changed_.wait_for(lock, kCancelCheck);
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
  }
  if (request->service().empty()) {
    lock.unlock();
    response.set_status(HealthCheckResponse::NOT_SERVING);
    writer->Write(response);
  }
  return grpc::Status::OK;
}

void ServingStatusService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
  }
  changed_.notify_all();
}

}  // namespace vfio_dra::kubeletplugin
