// ClientConfig: where the API server is and how to authenticate, loaded from a kubeconfig file
// (development, tests) or from the pod's service account (in-cluster). Only the kubeconfig
// subset that a node daemon needs is supported; anything else is refused with an error naming the
// file and the entry rather than silently ignored.
#pragma once

#include <optional>
#include <string>

#include "base/result.h"

namespace vfio_dra::kube {

struct ClientConfig {
  std::string server;  // "https://host:port" (or http:// for loopback tests)
  std::string ca_file;
  std::string ca_data;  // PEM
  bool insecure_skip_tls_verify = false;
  std::string token;       // static bearer token
  std::string token_file;  // re-read periodically and after a 401
  std::string client_cert_file;
  std::string client_cert_data;  // PEM
  std::string client_key_file;
  std::string client_key_data;  // PEM
  std::string source;           // where this config came from, for error messages
};

// Parses kubeconfig YAML text. `path` is used to resolve relative file references and in errors.
Result<ClientConfig> ParseKubeconfig(const std::string& yaml_text, const std::string& path);

// Reads and parses the kubeconfig file at `path`.
Result<ClientConfig> LoadKubeconfigFile(const std::string& path);

struct InClusterEnvironment {
  std::string service_host;  // KUBERNETES_SERVICE_HOST
  std::string service_port;  // KUBERNETES_SERVICE_PORT
  std::string secrets_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
};

// Builds the in-cluster config from the service-account mount; fails with kNotFound when the
// environment variables are absent (not running in a pod).
Result<ClientConfig> InClusterConfig(const InClusterEnvironment& env);

// Picks the config the way the daemon is told to: an explicit --kubeconfig, else $KUBECONFIG
// (first entry), else in-cluster.
Result<ClientConfig> ResolveClientConfig(const std::string& kubeconfig_flag);

}  // namespace vfio_dra::kube
