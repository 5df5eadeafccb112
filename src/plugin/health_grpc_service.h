// DeviceHealthService: the kubelet's device health stream (v1alpha1.DRAResourceHealth,
// NodeWatchResources). Each stream gets the complete list at once and again every interval: the
// kubelet treats every message as the whole truth for the driver and marks a device Unknown when
// it has not heard of it for its timeout (30 s), so the list is re-sent even when nothing changed.
// Streams end when the kubelet cancels them or the daemon shuts down (Shutdown), never blocking
// the server's stop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "dra_health_v1alpha1.pb.h"
#include "plugin/grpc_method.h"
#include "prepare/device_preparer.h"

namespace vfio_dra::plugin {

class DeviceHealthService final {
 public:
  using Source = std::function<std::vector<prepare::DeviceHealthStatus>()>;
  DeviceHealthService(Source source, std::chrono::milliseconds interval, Logger log);

  // /v1alpha1.DRAResourceHealth/NodeWatchResources.
  std::vector<GrpcMethod> Methods();

  GrpcStatus NodeWatchResources(const CallContext& context,
                                StreamWriter<v1alpha1::NodeWatchResourcesResponse>& writer);

  // Ends every open stream and refuses new ones; call before stopping the server.
  void Shutdown();

  // The message sent for `statuses` at `unix_seconds`.
  static v1alpha1::NodeWatchResourcesResponse Message(
      const std::vector<prepare::DeviceHealthStatus>& statuses, int64_t unix_seconds);

 private:
  Source source_;
  std::chrono::milliseconds interval_;
  Logger log_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace vfio_dra::plugin
