// fake-apiserver: runs the test API server as a process (for the demo and the VM tests).
// Loads ResourceClaims and Pods from JSON files, writes a kubeconfig, serves until SIGTERM/SIGINT.
// With --rbac, requests are authorized by the roles a manifest file binds to the plugin's service
// account (or --rbac-user), as a cluster's RBAC would.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "fake_apiserver.h"

int main(int argc, char** argv) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  CLI::App app{"fake-apiserver: a loopback Kubernetes API server for tests and the demo"};
  int port = 0;
  std::string kubeconfig_dir;
  std::string claims_file;
  std::string pods_file;
  std::string node;
  std::string minor = "35";
  std::string rbac_file;
  std::string rbac_user = vfio_dra::testing::kPluginServiceAccountUser;
  app.add_option("--port", port, "port on 127.0.0.1 (0: any)");
  app.add_option("--kubeconfig-dir", kubeconfig_dir, "write a kubeconfig here")->required();
  app.add_option("--claims", claims_file, "JSON file with a list of ResourceClaims to serve");
  app.add_option("--pods", pods_file,
                 "JSON file with a list of Pods to serve (each with metadata.name)");
  app.add_option("--node", node, "a Node object to serve, as name:uid");
  app.add_option("--minor-version", minor, "Kubernetes minor version to report");
  app.add_option("--rbac", rbac_file,
                 "YAML manifest whose ClusterRoles/Roles bound to --rbac-user authorize requests "
                 "(default: everything is allowed)");
  app.add_option("--rbac-user", rbac_user, "the user every request is made by, for --rbac");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  vfio_dra::testing::FakeApiServerOptions options;
  options.minor_version = minor;
  options.rbac_file = rbac_file;
  options.rbac_user = rbac_user;
  if (!rbac_file.empty()) {
    // Checked here too, so that a bad file is reported as bad input (2), not as a port problem.
    auto rbac = vfio_dra::testing::RbacAuthorizer::Load(rbac_file, rbac_user);
    if (!rbac.ok()) {
      std::cerr << "fake-apiserver: " << rbac.error().message << "\n";
      return 2;
    }
  }
  vfio_dra::testing::FakeApiServer server(options);
  if (!claims_file.empty()) {
    std::ifstream in(claims_file);
    auto claims = nlohmann::json::parse(in, nullptr, false);
    if (claims.is_discarded() || !claims.is_array()) {
      std::cerr << "fake-apiserver: " << claims_file << " is not a JSON list of claims\n";
      return 2;
    }
    for (auto& claim : claims) server.PutClaim(claim);
  }
  if (!pods_file.empty()) {
    std::ifstream in(pods_file);
    auto pods = nlohmann::json::parse(in, nullptr, false);
    if (pods.is_discarded() || !pods.is_array()) {
      std::cerr << "fake-apiserver: " << pods_file << " is not a JSON list of pods\n";
      return 2;
    }
    for (auto& pod : pods) {
      const bool named =
          pod.is_object() && pod.contains("metadata") && pod["metadata"].is_object() &&
          pod["metadata"].contains("name") && pod["metadata"]["name"].is_string() &&
          (!pod["metadata"].contains("namespace") || pod["metadata"]["namespace"].is_string());
      if (!named) {
        std::cerr << "fake-apiserver: " << pods_file
                  << ": every pod needs a string metadata.name (and namespace, if any): "
                  << pod.dump().substr(0, 200) << "\n";
        return 2;
      }
      server.PutPod(pod);
    }
  }
  if (!node.empty()) {
    const auto colon = node.find(':');
    server.PutNode(node.substr(0, colon), colon == std::string::npos ? "" : node.substr(colon + 1));
  }
  if (!server.Start(port)) {
    std::cerr << "fake-apiserver: cannot listen on 127.0.0.1:" << port << "\n";
    return 1;
  }
  std::cout << server.WriteKubeconfig(kubeconfig_dir) << std::endl;
  int signal_number = 0;
  sigwait(&set, &signal_number);
  server.Stop();
  return 0;
}
