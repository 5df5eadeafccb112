#include "plugin/health_grpc_service.h"

#include "base/text.h"

namespace vfio_dra::plugin {
namespace {

// The kubelet (1.36) truncates longer messages.
constexpr size_t kMaxMessage = 1000;
// Tells a 1.35+ kubelet how long a verdict stays valid: several intervals, so one late message
// does not turn devices Unknown.
constexpr int64_t kTimeoutIntervals = 3;

}  // namespace

DeviceHealthService::DeviceHealthService(Source source, std::chrono::milliseconds interval,
                                         Logger log)
    : source_(std::move(source)), interval_(interval), log_(std::move(log)) {}

v1alpha1::NodeWatchResourcesResponse DeviceHealthService::Message(
    const std::vector<prepare::DeviceHealthStatus>& statuses, int64_t unix_seconds) {
  v1alpha1::NodeWatchResourcesResponse response;
  for (const prepare::DeviceHealthStatus& status : statuses) {
    v1alpha1::DeviceHealth* health = response.add_devices();
    health->mutable_device()->set_pool_name(status.pool);
    health->mutable_device()->set_device_name(status.device);
    health->set_health(status.healthy ? v1alpha1::HEALTHY : v1alpha1::UNHEALTHY);
    health->set_last_updated_time(unix_seconds);
    if (!status.message.empty()) health->set_message(EscapeForDisplay(status.message, kMaxMessage));
  }
  return response;
}

std::vector<GrpcMethod> DeviceHealthService::Methods() {
  using v1alpha1::NodeWatchResourcesRequest;
  using v1alpha1::NodeWatchResourcesResponse;
  return {ServerStreamingMethod<NodeWatchResourcesRequest, NodeWatchResourcesResponse>(
      "/v1alpha1.DRAResourceHealth/NodeWatchResources",
      [this](const NodeWatchResourcesRequest& /*request*/, CallContext& context,
             StreamWriter<NodeWatchResourcesResponse>& writer) {
        return NodeWatchResources(context, writer);
      })};
}

GrpcStatus DeviceHealthService::NodeWatchResources(
    const CallContext& context, StreamWriter<v1alpha1::NodeWatchResourcesResponse>& writer) {
  const int64_t timeout_seconds = std::max<int64_t>(
      30, kTimeoutIntervals * std::chrono::duration_cast<std::chrono::seconds>(interval_).count());
  log_.Info("kubelet opened the device health stream", {{"peer", context.peer()}});
  std::vector<std::string> last_unhealthy;
  // The kubelet's cancel ends the wait between two lists at once, not an interval later.
  context.OnCancel([this] {
    std::lock_guard<std::mutex> lock(mu_);
    wake_.notify_all();
  });
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return GrpcStatus{GrpcCode::kUnavailable, "the plugin is stopping"};
    }
    const std::vector<prepare::DeviceHealthStatus> statuses = source_();
    std::vector<std::string> unhealthy;
    for (const prepare::DeviceHealthStatus& status : statuses) {
      if (!status.healthy) unhealthy.push_back(status.device + ": " + status.message);
    }
    if (unhealthy != last_unhealthy) {
      for (const std::string& line : unhealthy) log_.Warn("device unhealthy", {{"device", line}});
      last_unhealthy = unhealthy;
    }
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    v1alpha1::NodeWatchResourcesResponse response = Message(statuses, now);
    for (auto& device : *response.mutable_devices()) {
      device.set_health_check_timeout_seconds(timeout_seconds);
    }
    if (!writer.Write(response)) {
      log_.Info("device health stream closed by the kubelet", {{"peer", context.peer()}});
      return GrpcStatus::Ok();
    }
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, interval_, [&] { return stopping_ || context.IsCancelled(); });
    if (context.IsCancelled()) {
      log_.Info("device health stream cancelled by the kubelet", {{"peer", context.peer()}});
      return GrpcStatus{GrpcCode::kCancelled, "the kubelet cancelled the stream"};
    }
  }
}

void DeviceHealthService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
}

}  // namespace vfio_dra::plugin
