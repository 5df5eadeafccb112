// ResourceApiVersions: the resource.k8s.io versions this plugin speaks (v1, v1beta2, v1beta1)
// that the API server serves, newest first, from its discovery document. Claims are read and their
// status written only in these, so a server that removed a version (1.38 no longer serves v1beta1
// claims) never sees a request for it, even for a claim recorded in that version before the
// cluster's upgrade. Discovered on first use and again after Forget(), which callers use when a
// request in a version they were given meets a bare 404 (the server was upgraded under them).
// Thread-safe.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "kube/api_client.h"

namespace vfio_dra::kube {

class ResourceApiVersions {
 public:
  explicit ResourceApiVersions(ApiClient& client) : client_(client) {}

  // Served versions ("v1", ...), newest first; empty when the server serves none of them.
  // Errors are discovery failures (transport, server errors), retried on the next call.
  Result<std::vector<std::string>> Served(Deadline deadline = {});
  void Forget();

 private:
  ApiClient& client_;
  std::mutex mu_;
  std::optional<std::vector<std::string>> served_;
};

}  // namespace vfio_dra::kube
