#include "plugin/health_grpc_service.h"

#include "base/text.h"

namespace vfio_dra::plugin {
namespace {

// The kubelet truncates messages longer than 1024 characters (both versions); ours end earlier,
// with our own marker.
constexpr size_t kMaxMessage = 1000;
// Tells a 1.35+ kubelet how long a verdict stays valid: several intervals, so one late message
// does not turn devices Unknown.
constexpr int64_t kTimeoutIntervals = 3;

}  // namespace

DeviceHealthService::DeviceHealthService(Source source, std::chrono::milliseconds interval,
                                         Logger log)
    : source_(std::move(source)), interval_(interval), log_(std::move(log)) {}

template <typename Api>
typename Api::Response DeviceHealthService::Message(
    const std::vector<prepare::DeviceHealthStatus>& statuses, int64_t unix_seconds,
    int64_t timeout_seconds) {
  typename Api::Response response;
  for (const prepare::DeviceHealthStatus& status : statuses) {
    auto* health = response.add_devices();
    health->mutable_device()->set_pool_name(status.pool);
    health->mutable_device()->set_device_name(status.device);
    health->set_health(status.healthy ? Api::kHealthy : Api::kUnhealthy);
    health->set_last_updated_time(unix_seconds);
    health->set_health_check_timeout_seconds(timeout_seconds);
    if (!status.message.empty()) health->set_message(EscapeForDisplay(status.message, kMaxMessage));
  }
  return response;
}

template <typename Api>
GrpcMethod DeviceHealthService::Method() {
  return ServerStreamingMethod<typename Api::Request, typename Api::Response>(
      Api::kPath, [this](const typename Api::Request& /*request*/, CallContext& context,
                         StreamWriter<typename Api::Response>& writer) {
        return NodeWatchResources<Api>(context, writer);
      });
}

std::vector<GrpcMethod> DeviceHealthService::Methods() {
  return {Method<HealthV1Api>(), Method<HealthV1alpha1Api>()};
}

template <typename Api>
GrpcStatus DeviceHealthService::NodeWatchResources(const CallContext& context,
                                                   StreamWriter<typename Api::Response>& writer) {
  const int64_t timeout_seconds = std::max<int64_t>(
      30, kTimeoutIntervals * std::chrono::duration_cast<std::chrono::seconds>(interval_).count());
  log_.Info("kubelet opened the device health stream",
            {{"api", Api::kName}, {"peer", context.peer()}});
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
    if (!writer.Write(Message<Api>(statuses, now, timeout_seconds))) {
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

template GrpcStatus DeviceHealthService::NodeWatchResources<HealthV1Api>(
    const CallContext&, StreamWriter<HealthV1Api::Response>&);
template GrpcStatus DeviceHealthService::NodeWatchResources<HealthV1alpha1Api>(
    const CallContext&, StreamWriter<HealthV1alpha1Api::Response>&);
template HealthV1Api::Response DeviceHealthService::Message<HealthV1Api>(
    const std::vector<prepare::DeviceHealthStatus>&, int64_t, int64_t);
template HealthV1alpha1Api::Response DeviceHealthService::Message<HealthV1alpha1Api>(
    const std::vector<prepare::DeviceHealthStatus>&, int64_t, int64_t);

void DeviceHealthService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
}

}  // namespace vfio_dra::plugin
