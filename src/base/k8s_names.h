// Kubernetes name rules (RFC 1123 labels and subdomains), used for flags, claim references,
// device names and counter names alike.
#pragma once

#include <string>

namespace vfio_dra {

bool IsDnsLabel(const std::string& value);      // [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63
bool IsDnsSubdomain(const std::string& value);  // dot-separated labels, at most 253
// An object UID as it may appear in file and socket names: letters, digits and '-', 1 to 128.
bool IsObjectUid(const std::string& value);

}  // namespace vfio_dra
