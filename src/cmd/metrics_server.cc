#include "cmd/metrics_server.h"

#include <httplib.h>

#include "base/thread_name.h"

namespace vfio_dra::cmd {

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, MetricsRegistry& metrics,
    const std::function<HealthReport()>& health, const Logger& log) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "--metrics-address \"" + address + "\" is not host:port or :port");
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  int port = -1;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "--metrics-address \"" + address + "\": the port is not 0..65535");
  }
  std::unique_ptr<MetricsServer> out(new MetricsServer());
  out->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *out->server_;
  server.Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/livez", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server.Get("/healthz", [health](const httplib::Request&, httplib::Response& res) {
    const HealthReport report = health();
    res.status = report.registered && report.api_reachable ? 200 : 503;
    res.set_content(
        "kubelet registration: " + report.registration + "\nAPI server: " + report.api + "\n",
        "text/plain");
  });
  const int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return MakeError(ErrorKind::kUnavailable, "cannot listen on --metrics-address " + address +
                                                  " (in use, or not a local address)");
  }
  out->port_ = bound;
  out->thread_ = std::thread([&server, listening = &out->listening_done_] {
    NameThisThread("metrics-http");
    server.listen_after_bind();
    listening->store(true);
  });
  log.Info("metrics and health endpoint listening",
           {{"address", host + ":" + std::to_string(bound)}});
  return out;
}

MetricsServer::~MetricsServer() {
  if (server_ && thread_.joinable()) {
    // httplib's stop() does nothing until the listen loop has started, and the loop would then
    // never end: wait for it to be running (or to have given up) before stopping it. It starts
    // within microseconds of Start; this wait matters when the daemon fails right after Start.
    while (!listening_done_.load() && !server_->is_running()) std::this_thread::yield();
    server_->stop();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace vfio_dra::cmd
