// The fake API server as the benchmarks run it: over TLS with a self-signed certificate for
// 127.0.0.1, which the plugin verifies against the CA its kubeconfig names, as on a node; started,
// with the node "node1" known.
#pragma once

#include <iostream>
#include <memory>
#include <string>

#include "fake_apiserver.h"
#include "self_signed_certificate.h"

namespace vfio_dra::bench {

// Makes the certificate in `dir` and starts the server with `options` (their TLS files set
// here). Null, after a message on stderr naming `who`, when the certificate cannot be made.
inline std::unique_ptr<testing::FakeApiServer> StartTlsApiServer(
    const std::string& dir, testing::FakeApiServerOptions options, const std::string& who) {
  if (Status cert = testing::MakeSelfSignedCertificate(dir, "apiserver", "IP:127.0.0.1");
      !cert.ok()) {
    std::cerr << who << ": " << cert.error().message << "\n";
    return nullptr;
  }
  options.tls_cert_file = dir + "/apiserver.crt";
  options.tls_key_file = dir + "/apiserver.key";
  auto server = std::make_unique<testing::FakeApiServer>(std::move(options));
  server->Start();
  server->PutNode("node1", "6a0a1d47-0000-4000-8000-0000000000aa");
  return server;
}

}  // namespace vfio_dra::bench
