#include "plugin/registration_service.h"

namespace vfio_dra::plugin {

Status ValidateDraEndpoint(const std::string& endpoint) {
  const auto invalid = [&](const std::string& problem) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "DRA socket path \"" + endpoint + "\" " + problem +
                         " (the kubelet would refuse to register the plugin)");
  };
  if (endpoint.empty() || endpoint.front() != '/') return invalid("is not an absolute path");
  if (endpoint.size() >= 108) {
    return invalid("is " + std::to_string(endpoint.size()) +
                   " bytes long, the limit is 107: choose a shorter --plugin-data-dir");
  }
  for (char c : endpoint) {
    if (c == '%' || c == '?' || c == '#') {
      return invalid(std::string("contains '") + c + "', which a unix: URL does not keep as is");
    }
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return invalid("contains a control character");
    }
  }
  return Status::Ok();
}

RegistrationService::RegistrationService(std::string driver_name, std::string dra_endpoint,
                                         std::vector<std::string> supported_versions, Logger log)
    : driver_name_(std::move(driver_name)),
      dra_endpoint_(std::move(dra_endpoint)),
      supported_versions_(std::move(supported_versions)),
      log_(std::move(log)) {}

std::vector<GrpcMethod> RegistrationService::Methods() {
  using pluginregistration::InfoRequest;
  using pluginregistration::PluginInfo;
  using pluginregistration::RegistrationStatus;
  using pluginregistration::RegistrationStatusResponse;
  return {UnaryMethod<InfoRequest, PluginInfo>(
              "/pluginregistration.Registration/GetInfo",
              [this](const InfoRequest& request, CallContext& /*context*/, PluginInfo* response) {
                return GetInfo(request, response);
              }),
          UnaryMethod<RegistrationStatus, RegistrationStatusResponse>(
              "/pluginregistration.Registration/NotifyRegistrationStatus",
              [this](const RegistrationStatus& request, CallContext& /*context*/,
                     RegistrationStatusResponse* response) {
                return NotifyRegistrationStatus(request, response);
              })};
}

GrpcStatus RegistrationService::GetInfo(const pluginregistration::InfoRequest& /*request*/,
                                        pluginregistration::PluginInfo* response) {
  response->set_type("DRAPlugin");
  response->set_name(driver_name_);
  response->set_endpoint(dra_endpoint_);
  for (const std::string& version : supported_versions_) response->add_supported_versions(version);
  log_.Debug(2, "kubelet asked for plugin info", {{"endpoint", dra_endpoint_}});
  return GrpcStatus::Ok();
}

GrpcStatus RegistrationService::NotifyRegistrationStatus(
    const pluginregistration::RegistrationStatus& request,
    pluginregistration::RegistrationStatusResponse* /*response*/) {
  std::lock_guard<std::mutex> lock(mu_);
  if (request.plugin_registered()) {
    state_ = RegistrationState::kRegistered;
    last_error_.clear();
    log_.Info("registered with the kubelet", {{"driver", driver_name_}});
  } else {
    state_ = RegistrationState::kRejected;
    last_error_ = request.error();
    log_.Error("the kubelet rejected the registration",
               {{"driver", driver_name_}, {"reason", request.error()}});
  }
  return GrpcStatus::Ok();
}

RegistrationState RegistrationService::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

std::string RegistrationService::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

}  // namespace vfio_dra::plugin
