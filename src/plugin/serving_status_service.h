// ServingStatusService: the standard gRPC health service (grpc.health.v1.Health) of one plugin
// socket. The server as a whole (service "") is SERVING from the start and NOT_SERVING once
// Shutdown is called; any other service name is unknown. Watch streams end at Shutdown, never
// holding up the server's stop.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "grpc_health_v1.pb.h"
#include "plugin/grpc_method.h"

namespace vfio_dra::plugin {

class ServingStatusService final {
 public:
  ServingStatusService() = default;

  // /grpc.health.v1.Health/Check and /grpc.health.v1.Health/Watch.
  std::vector<GrpcMethod> Methods();

  GrpcStatus Check(const grpc::health::v1::HealthCheckRequest& request,
                   grpc::health::v1::HealthCheckResponse* response);
  GrpcStatus Watch(const CallContext& context, const grpc::health::v1::HealthCheckRequest& request,
                   StreamWriter<grpc::health::v1::HealthCheckResponse>& writer);

  // From now on the server is NOT_SERVING; open Watch streams get that answer and end.
  void Shutdown();

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool shut_down_ = false;
};

}  // namespace vfio_dra::plugin
