// self_signed_certificate: TLS material for the fake API server in tests and benchmarks, made by
// the openssl command (hack/install-deps.sh installs it) so that no test carries a key in the tree
// and none outlives a day.
#pragma once

#include <string>

#include "base/result.h"

namespace vfio_dra::testing {

// Writes <dir>/<name>.crt and <dir>/<name>.key: a self-signed certificate with CN <name> and the
// given subjectAltName (e.g. "IP:127.0.0.1" or "IP:127.0.0.2,DNS:api.example.com"), which also
// serves as its own CA. The error names the command that failed.
Status MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                                 const std::string& alt_names);

}  // namespace vfio_dra::testing
