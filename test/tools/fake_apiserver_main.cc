// fake-apiserver: runs the test API server as a process (for the demo and the VM tests).
// Loads ResourceClaims from a JSON file, writes a kubeconfig, serves until SIGTERM/SIGINT.
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
  std::string node;
  std::string minor = "35";
  app.add_option("--port", port, "port on 127.0.0.1 (0: any)");
  app.add_option("--kubeconfig-dir", kubeconfig_dir, "write a kubeconfig here")->required();
  app.add_option("--claims", claims_file, "JSON file with a list of ResourceClaims to serve");
  app.add_option("--node", node, "a Node object to serve, as name:uid");
  app.add_option("--minor-version", minor, "Kubernetes minor version to report");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  vfio_dra::testing::FakeApiServerOptions options;
  options.minor_version = minor;
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
