// RegistrationService: the kubelet plugin-registration endpoint (pluginregistration.Registration).
// GetInfo answers at once with what the kubelet needs to reach the DRA service; the kubelet's
// verdict (NotifyRegistrationStatus) is recorded for /healthz and logged, a rejection as an error
// carrying the kubelet's reason.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/result.h"
#include "plugin/grpc_method.h"
#include "pluginregistration.pb.h"

namespace vfio_dra::plugin {

// Identifiers of the gRPC services this plugin serves, in the order a 1.34+ kubelet picks the
// DRA API from (first supported wins): v1 first, then v1beta1 for 1.32/1.33 kubelets. Then the
// device health stream, newest first as well, though the kubelet goes by its own preference
// (1.37+ takes v1 and keeps v1alpha1 until 1.40; 1.34 to 1.36 know only v1alpha1); kubelets that
// know neither ignore both.
inline const std::vector<std::string>& SupportedDraServices() {
  static const std::vector<std::string> kServices = {
      "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"};
  return kServices;
}

// The kubelet (1.38+) registers a plugin only if its endpoint is an absolute path shorter than 108
// bytes (a unix socket path and its NUL) that reads as a plain path in a unix: URL: no '%', '?' or
// '#'. Older kubelets fail later and less clearly, so the plugin holds itself to this on every
// release. The error names the path and what is wrong with it.
Status ValidateDraEndpoint(const std::string& endpoint);

enum class RegistrationState { kPending, kRegistered, kRejected };

class RegistrationService final {
 public:
  RegistrationService(std::string driver_name, std::string dra_endpoint,
                      std::vector<std::string> supported_versions, Logger log);

  // The registration socket's methods (/pluginregistration.Registration/...).
  std::vector<GrpcMethod> Methods();

  GrpcStatus GetInfo(const pluginregistration::InfoRequest& request,
                     pluginregistration::PluginInfo* response);
  GrpcStatus NotifyRegistrationStatus(const pluginregistration::RegistrationStatus& request,
                                      pluginregistration::RegistrationStatusResponse* response);

  RegistrationState state() const;
  std::string last_error() const;

 private:
  const std::string driver_name_;
  const std::string dra_endpoint_;
  const std::vector<std::string> supported_versions_;
  Logger log_;
  mutable std::mutex mu_;
  RegistrationState state_ = RegistrationState::kPending;
  std::string last_error_;
};

}  // namespace vfio_dra::plugin
