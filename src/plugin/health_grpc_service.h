// DeviceHealthService: the kubelet's device health stream (DRAResourceHealth, NodeWatchResources)
// in both versions a kubelet may pick: v1 (1.37+) and v1alpha1 (1.34 to 1.39). Each stream gets
// the complete list at once and again every interval: the kubelet treats every message as the
// whole truth for the driver and marks a device Unknown when it has not heard of it for its
// timeout (30 s), so the list is re-sent even when nothing changed. Streams end when the kubelet
// cancels them or the daemon shuts down (Shutdown), never blocking the server's stop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "dra_health_v1.pb.h"
#include "dra_health_v1alpha1.pb.h"
#include "plugin/grpc_method.h"
#include "prepare/device_preparer.h"

namespace vfio_dra::plugin {

// The two versions have the same messages under different packages, so one template serves
// both; "v1.DRAResourceHealth" is also the gRPC service name (its package is plain "v1").
struct HealthV1Api {
  static constexpr const char* kPath = "/v1.DRAResourceHealth/NodeWatchResources";
  static constexpr const char* kName = "v1";
  using Request = ::v1::NodeWatchResourcesRequest;
  using Response = ::v1::NodeWatchResourcesResponse;
  static constexpr ::v1::HealthStatus kHealthy = ::v1::HEALTHY;
  static constexpr ::v1::HealthStatus kUnhealthy = ::v1::UNHEALTHY;
};

struct HealthV1alpha1Api {
  static constexpr const char* kPath = "/v1alpha1.DRAResourceHealth/NodeWatchResources";
  static constexpr const char* kName = "v1alpha1";
  using Request = ::v1alpha1::NodeWatchResourcesRequest;
  using Response = ::v1alpha1::NodeWatchResourcesResponse;
  static constexpr ::v1alpha1::HealthStatus kHealthy = ::v1alpha1::HEALTHY;
  static constexpr ::v1alpha1::HealthStatus kUnhealthy = ::v1alpha1::UNHEALTHY;
};

class DeviceHealthService final {
 public:
  using Source = std::function<std::vector<prepare::DeviceHealthStatus>()>;
  DeviceHealthService(Source source, std::chrono::milliseconds interval, Logger log);

  // /v1.DRAResourceHealth/NodeWatchResources, then /v1alpha1.DRAResourceHealth/...
  std::vector<GrpcMethod> Methods();

  template <typename Api>
  GrpcStatus NodeWatchResources(const CallContext& context,
                                StreamWriter<typename Api::Response>& writer);

  // Ends every open stream and refuses new ones; call before stopping the server.
  void Shutdown();

  // The message sent for `statuses` at `unix_seconds`, each verdict valid for `timeout_seconds`.
  template <typename Api>
  static typename Api::Response Message(const std::vector<prepare::DeviceHealthStatus>& statuses,
                                        int64_t unix_seconds, int64_t timeout_seconds);

 private:
  template <typename Api>
  GrpcMethod Method();

  Source source_;
  std::chrono::milliseconds interval_;
  Logger log_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace vfio_dra::plugin
