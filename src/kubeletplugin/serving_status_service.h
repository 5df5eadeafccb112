// ServingStatusService: the standard gRPC health service (grpc.health.v1.Health) of one plugin
// socket. The server as a whole (service "") is SERVING from the start and NOT_SERVING once
// Shutdown is called; any other service name is unknown. It is a synchronous service on purpose:
// gRPC's built-in health service uses the callback API, which on this gRPC starts two polling
// threads that wake every second for the life of the process, and an idle node agent must not.
// Watch streams end at Shutdown, never holding up the server's stop.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "grpc_health_v1.grpc.pb.h"

namespace vfio_dra::kubeletplugin {

class ServingStatusService final : public grpc::health::v1::Health::Service {
 public:
  ServingStatusService() = default;

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

  // From now on the server is NOT_SERVING; open Watch streams get that answer and end.
  void Shutdown();

 private:
  // How often a Watch stream with nothing to say checks whether its caller went away.
  static constexpr std::chrono::seconds kCancelCheck{5};

  std::mutex mu_;
  std::condition_variable changed_;
  bool shut_down_ = false;
};

}  // namespace vfio_dra::kubeletplugin
