#include "kube/client_config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>

#include "base/base64.h"
#include "base/file_io.h"

namespace vfio_dra::kube {
namespace {

// Describes where in the kubeconfig a node is, for error messages ("file:line: key").
std::string Where(const std::string& path, const YAML::Node& node, const std::string& key) {
  const YAML::Mark mark = node.Mark();
  std::string where = path;
  if (mark.line >= 0) where += ":" + std::to_string(mark.line + 1);
  return where + ": " + key;
}

Error ConfigError(const std::string& path, const YAML::Node& node, const std::string& key,
                  const std::string& problem) {
  return MakeError(ErrorKind::kInvalidArgument,
                   "invalid kubeconfig " + Where(path, node, key) + ": " + problem);
}

// Reads an optional scalar string field; a non-scalar value is an error.
Result<std::string> OptionalString(const std::string& path, const YAML::Node& parent,
                                   const std::string& key) {
  YAML::Node value = parent[key];
  if (!value || value.IsNull()) return std::string();
  if (!value.IsScalar()) return ConfigError(path, value, key, "must be a string");
  return value.as<std::string>();
}

// Finds the entry `name` in a kubeconfig list such as `clusters` and returns its inner mapping
// (`cluster`, `user`, `context`).
Result<YAML::Node> FindNamed(const std::string& path, const YAML::Node& root,
                             const std::string& list_key, const std::string& inner_key,
                             const std::string& name) {
  YAML::Node list = root[list_key];
  if (!list || !list.IsSequence()) {
    return ConfigError(path, root, list_key,
                       "missing or not a list (looking for \"" + name + "\")");
  }
  for (const YAML::Node& entry : list) {
    if (!entry.IsMap()) return ConfigError(path, entry, list_key, "entries must be mappings");
    YAML::Node entry_name = entry["name"];
    if (entry_name && entry_name.IsScalar() && entry_name.as<std::string>() == name) {
      YAML::Node inner = entry[inner_key];
      if (!inner || !inner.IsMap()) {
        return ConfigError(path, entry, list_key + "[" + name + "]." + inner_key,
                           "missing or not a mapping");
      }
      return inner;
    }
  }
  return ConfigError(path, list, list_key, "no entry named \"" + name + "\"");
}

std::string ResolvePath(const std::string& kubeconfig_path, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  std::filesystem::path base = std::filesystem::path(kubeconfig_path).parent_path();
  return (base / file).string();
}

Result<std::string> DecodeData(const std::string& path, const YAML::Node& parent,
                               const std::string& key) {
  auto text = OptionalString(path, parent, key);
  if (!text.ok() || text->empty()) return text;
  auto decoded = Base64Decode(*text);
  if (!decoded.ok()) return ConfigError(path, parent[key], key, decoded.error().message);
  return decoded;
}

Result<ClientConfig> ParseKubeconfigRoot(const YAML::Node& root, const std::string& path) {
  if (!root.IsMap()) return ConfigError(path, root, "(document)", "must be a mapping");
  ClientConfig config;
  config.source = path;

  auto current = OptionalString(path, root, "current-context");
  if (!current.ok()) return current.error();
  if (current->empty()) {
    return ConfigError(path, root, "current-context", "is not set; name the context to use");
  }
  auto context = FindNamed(path, root, "contexts", "context", *current);
  if (!context.ok()) return context.error();
  auto cluster_name = OptionalString(path, *context, "cluster");
  if (!cluster_name.ok()) return cluster_name.error();
  auto user_name = OptionalString(path, *context, "user");
  if (!user_name.ok()) return user_name.error();
  if (cluster_name->empty()) {
    return ConfigError(path, *context, "contexts[" + *current + "].context.cluster", "is not set");
  }

  auto cluster = FindNamed(path, root, "clusters", "cluster", *cluster_name);
  if (!cluster.ok()) return cluster.error();
  for (const auto& kv : *cluster) {
    const std::string key = kv.first.as<std::string>();
    if (key == "proxy-url") {
      return ConfigError(path, kv.second, "clusters[" + *cluster_name + "].cluster.proxy-url",
                         "proxies are not supported by vfio-dra-plugin");
    }
  }
  auto server = OptionalString(path, *cluster, "server");
  if (!server.ok()) return server.error();
  if (server->empty()) {
    return ConfigError(path, *cluster, "clusters[" + *cluster_name + "].cluster.server",
                       "is not set");
  }
  if (server->rfind("https://", 0) != 0 && server->rfind("http://", 0) != 0) {
    return ConfigError(path, (*cluster)["server"], "clusters[" + *cluster_name + "].cluster.server",
                       "must start with https:// or http://, got \"" + *server + "\"");
  }
  while (!server->empty() && server->back() == '/') server->pop_back();
  config.server = *server;
  auto ca_file = OptionalString(path, *cluster, "certificate-authority");
  if (!ca_file.ok()) return ca_file.error();
  config.ca_file = ResolvePath(path, *ca_file);
  auto ca_data = DecodeData(path, *cluster, "certificate-authority-data");
  if (!ca_data.ok()) return ca_data.error();
  config.ca_data = *ca_data;
  if (YAML::Node insecure = (*cluster)["insecure-skip-tls-verify"]; insecure) {
    if (!insecure.IsScalar() ||
        (insecure.as<std::string>() != "true" && insecure.as<std::string>() != "false")) {
      return ConfigError(path, insecure, "insecure-skip-tls-verify", "must be true or false");
    }
    config.insecure_skip_tls_verify = insecure.as<std::string>() == "true";
  }
  if (YAML::Node server_name = (*cluster)["tls-server-name"]; server_name) {
    return ConfigError(path, server_name, "clusters[" + *cluster_name + "].cluster.tls-server-name",
                       "is not supported by vfio-dra-plugin; use a server address that matches "
                       "the certificate");
  }

  if (!user_name->empty()) {
    auto user = FindNamed(path, root, "users", "user", *user_name);
    if (!user.ok()) return user.error();
    for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
      if ((*user)[unsupported]) {
        return ConfigError(path, (*user)[unsupported],
                           "users[" + *user_name + "].user." + unsupported,
                           "is not supported by vfio-dra-plugin; use token, tokenFile or a client "
                           "certificate");
      }
    }
    auto token = OptionalString(path, *user, "token");
    if (!token.ok()) return token.error();
    config.token = *token;
    auto token_file = OptionalString(path, *user, "tokenFile");
    if (!token_file.ok()) return token_file.error();
    config.token_file = ResolvePath(path, *token_file);
    auto cert_file = OptionalString(path, *user, "client-certificate");
    if (!cert_file.ok()) return cert_file.error();
    config.client_cert_file = ResolvePath(path, *cert_file);
    auto cert_data = DecodeData(path, *user, "client-certificate-data");
    if (!cert_data.ok()) return cert_data.error();
    config.client_cert_data = *cert_data;
    auto key_file = OptionalString(path, *user, "client-key");
    if (!key_file.ok()) return key_file.error();
    config.client_key_file = ResolvePath(path, *key_file);
    auto key_data = DecodeData(path, *user, "client-key-data");
    if (!key_data.ok()) return key_data.error();
    config.client_key_data = *key_data;
    const bool has_cert = !config.client_cert_file.empty() || !config.client_cert_data.empty();
    const bool has_key = !config.client_key_file.empty() || !config.client_key_data.empty();
    if (has_cert != has_key) {
      return ConfigError(path, *user, "users[" + *user_name + "].user",
                         "a client certificate needs both the certificate and the key");
    }
  }
  return config;
}

}  // namespace

Result<ClientConfig> ParseKubeconfig(const std::string& yaml_text, const std::string& path) {
  try {
    return ParseKubeconfigRoot(YAML::Load(yaml_text), path);
  } catch (const YAML::Exception& e) {
    std::string where = path;
    if (e.mark.line >= 0) where += ":" + std::to_string(e.mark.line + 1);
    return MakeError(ErrorKind::kInvalidArgument, "invalid kubeconfig " + where + ": " + e.msg);
  }
}

Result<ClientConfig> LoadKubeconfigFile(const std::string& path) {
  auto text = ReadFileToString(path, 4 << 20);
  if (!text.ok()) return text.error().Wrap("cannot load kubeconfig");
  return ParseKubeconfig(*text, path);
}

Result<ClientConfig> InClusterConfig(const InClusterEnvironment& env) {
  if (env.service_host.empty() || env.service_port.empty()) {
    return MakeError(ErrorKind::kNotFound,
                     "not running in a cluster: KUBERNETES_SERVICE_HOST and "
                     "KUBERNETES_SERVICE_PORT are not set; pass --kubeconfig");
  }
  ClientConfig config;
  std::string host = env.service_host;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  config.server = "https://" + host + ":" + env.service_port;
  config.token_file = env.secrets_dir + "/token";
  config.ca_file = env.secrets_dir + "/ca.crt";
  config.source = "in-cluster service account (" + env.secrets_dir + ")";
  return config;
}

Result<ClientConfig> ResolveClientConfig(const std::string& kubeconfig_flag) {
  if (!kubeconfig_flag.empty()) return LoadKubeconfigFile(kubeconfig_flag);
  if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && env[0] != '\0') {
    std::string first(env);
    first = first.substr(0, first.find(':'));
    return LoadKubeconfigFile(first);
  }
  InClusterEnvironment in_cluster;
  if (const char* h = std::getenv("KUBERNETES_SERVICE_HOST")) in_cluster.service_host = h;
  if (const char* p = std::getenv("KUBERNETES_SERVICE_PORT")) in_cluster.service_port = p;
  return InClusterConfig(in_cluster);
}

}  // namespace vfio_dra::kube
