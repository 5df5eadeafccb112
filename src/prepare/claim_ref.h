// ClaimRef: the (namespace, name, uid) triple the kubelet sends for each claim, and the checks
// that keep a malformed one from reaching the API server or a file path.
#pragma once

#include <string>

#include "base/result.h"
#include "base/text.h"

namespace vfio_dra::prepare {

struct ClaimRef {
  std::string namespace_;
  std::string name;
  std::string uid;

  // "namespace/name", with control and non-ASCII bytes escaped so it is safe in any message.
  std::string Display() const;
};

// A claim's namespace must be a DNS label, its name a DNS subdomain and its UID a plain token of
// letters, digits and '-' (Kubernetes UIDs are UUIDs). These values later become API paths and
// file names, so anything else is refused here.
Status ValidateClaimRef(const ClaimRef& claim);

}  // namespace vfio_dra::prepare
