// ServerProfile: what the API server accepts for ResourceSlices (its resource.k8s.io version and
// its Kubernetes minor version) and the counter layout that follows from it.
#pragma once

#include <string>

#include "base/result.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

struct ServerProfile {
  std::string api_version = "v1";  // v1 | v1beta2 | v1beta1
  int kubernetes_minor = 35;
  bool counters_dropped = false;  // the partitionable-devices gate is off on the server
  bool taints_dropped = false;    // the device-taints gate is off on the server

  CounterLayout Layout() const;
  // Device taints: alpha in 1.33 and 1.34 (gate off by default: the server drops them, which the
  // reconciler notices once), beta in 1.36, GA in 1.37.
  bool Taints() const { return !taints_dropped && kubernetes_minor >= 33; }
};

// Parses "1.35" (or "v1.35.2") into the minor number; errors name the value.
Result<int> ParseKubernetesMinor(const std::string& version);

}  // namespace vfio_dra::slicepublisher
