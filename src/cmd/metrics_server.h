// MetricsServer: the daemon's HTTP endpoint (--metrics-address) for Prometheus and probes:
//   /metrics  the registry in the text exposition format
//   /livez    200 while the process serves (liveness: restarting cannot fix an API outage, and
//             a dead daemon cannot unprepare)
//   /healthz  200 when the kubelet has registered the plugin and the API server is reachable,
//             503 otherwise; the body says which (readiness)
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "base/log.h"
#include "base/metrics.h"
#include "base/result.h"

namespace httplib {
class Server;
}

namespace vfio_dra::cmd {

struct HealthReport {
  bool registered = false;
  std::string registration;  // "pending", "registered", "rejected: <reason>"
  bool api_reachable = false;
  std::string api;  // "ok" or the last error
};

class MetricsServer {
 public:
  // `address` is "host:port" or ":port" (all interfaces); port 0 picks a free one.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                      MetricsRegistry& metrics,
                                                      const std::function<HealthReport()>& health,
                                                      const Logger& log);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listening_done_{false};  // listen_after_bind returned
  int port_ = 0;
};

}  // namespace vfio_dra::cmd
