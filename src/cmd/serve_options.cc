#include "cmd/serve_options.h"

#include <cctype>

#include "base/k8s_names.h"
#include "plugin/plugin_server.h"
#include "plugin/registration_service.h"

namespace vfio_dra::cmd {
namespace {

Error FlagError(const std::string& flag, const std::string& problem) {
  return MakeError(ErrorKind::kInvalidArgument, flag + ": " + problem);
}

Status CheckAbsolutePath(const std::string& flag, const std::string& value) {
  if (value.empty() || value[0] != '/') {
    return FlagError(flag, "must be an absolute path, got \"" + value + "\"");
  }
  for (char c : value) {
    if (c == '\0' || c == '\n') return FlagError(flag, "contains a control character");
  }
  return Status::Ok();
}

}  // namespace

Status FinalizeServeOptions(ServeOptions& options) {
  if (options.driver_name.size() > 63 || !IsDnsSubdomain(options.driver_name)) {
    return FlagError("--driver-name",
                     "must be a lower-case DNS subdomain of at most 63 "
                     "characters (like vfio.dra.io), got \"" +
                         options.driver_name + "\"");
  }
  if (options.node_name.empty()) {
    return FlagError("--node-name", "is required (or set NODE_NAME)");
  }
  if (!IsDnsSubdomain(options.node_name)) {
    return FlagError("--node-name",
                     "must be a lower-case DNS subdomain, got \"" + options.node_name + "\"");
  }
  if (!options.pod_uid.empty()) {
    // The UID becomes part of socket file names, so it must be a plain token.
    bool ok = options.pod_uid.size() <= 64;
    for (char c : options.pod_uid) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') ok = false;
    }
    if (!ok) {
      return FlagError("--pod-uid",
                       "must be a pod UID (letters, digits and '-', at most 64), "
                       "got \"" +
                           options.pod_uid + "\"");
    }
  }
  if (options.plugin_data_dir.empty()) {
    options.plugin_data_dir = "/var/lib/kubelet/plugins/" + options.driver_name;
  }
  for (const auto& [flag, value] :
       {std::pair<std::string, const std::string*>{"--sysfs-root", &options.sysfs_root},
        {"--dev-root", &options.dev_root},
        {"--registrar-dir", &options.registrar_dir},
        {"--plugin-data-dir", &options.plugin_data_dir},
        {"--cdi-dir", &options.cdi_dir}}) {
    if (Status s = CheckAbsolutePath(flag, *value); !s.ok()) return s;
  }
  // The kubelet is told the DRA socket's path at registration; refuse here what it would refuse
  // there, before any socket exists.
  const plugin::SocketLayout layout = plugin::SocketLayout::For(
      options.plugin_data_dir, options.registrar_dir, options.driver_name, options.pod_uid);
  if (Status s = plugin::ValidateDraEndpoint(layout.dra_socket); !s.ok()) {
    return s.error().Wrap("--plugin-data-dir");
  }
  if (layout.registration_socket.size() >= 108) {
    return FlagError("--registrar-dir", "the registration socket path \"" +
                                            layout.registration_socket + "\" is " +
                                            std::to_string(layout.registration_socket.size()) +
                                            " bytes long, a unix socket path has at most 107");
  }
  if (!options.host_netns.empty()) {
    if (Status s = CheckAbsolutePath("--host-netns", options.host_netns); !s.ok()) return s;
  }
  if (!options.simulated_vf_network_dir.empty()) {
    if (Status s =
            CheckAbsolutePath("--simulated-vf-network-dir", options.simulated_vf_network_dir);
        !s.ok()) {
      return s;
    }
  }
  if (options.kube_api_qps < 0) return FlagError("--kube-api-qps", "must not be negative");
  if (options.kube_api_burst < 1) return FlagError("--kube-api-burst", "must be at least 1");
  if (options.claim_api_qps < 0) return FlagError("--claim-api-qps", "must not be negative");
  if (options.claim_api_burst < 1) return FlagError("--claim-api-burst", "must be at least 1");
  if (options.unbind_timeout_seconds < 1 || options.unbind_timeout_seconds > 600) {
    return FlagError("--unbind-timeout", "must be between 1 and 600 seconds");
  }
  if (options.health_interval_seconds < 1 || options.health_interval_seconds > 10) {
    return FlagError("--health-interval",
                     "must be between 1 and 10 seconds (the kubelet forgets a device's health "
                     "after 30 s without news)");
  }
  if (options.close_idle_connections_seconds < 0 ||
      options.close_idle_connections_seconds > 86400) {
    return FlagError("--close-idle-connections",
                     "must be between 0 (never) and 86400 seconds; to work around kubelet "
                     "1.34.0's idle-connection deadlock it must be below 1800");
  }
  if (options.rescan_interval_seconds < 1 || options.rescan_interval_seconds > 3600) {
    return FlagError("--rescan-interval", "must be between 1 and 3600 seconds");
  }
  if (options.verbosity < 0 || options.verbosity > 10) {
    return FlagError("-v", "must be between 0 and 10");
  }
  return Status::Ok();
}

}  // namespace vfio_dra::cmd
