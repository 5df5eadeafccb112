// ResourceClaim JSON from the API server: parse any bytes as JSON, then as a claim; on success the
// claim's allocation results go through the per-request config lookup as prepare would.
#include <nlohmann/json.hpp>

#include "kube/resource_claim.h"
#include "prepare/vfio_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  auto claim = vfio_dra::kube::ParseResourceClaim(json);
  if (!claim.ok() || !claim->allocation) return 0;
  for (const auto& result : claim->allocation->results) {
    (void)vfio_dra::kube::BaseRequestName(result.request);
    (void)vfio_dra::prepare::ConfigForRequest(claim->allocation->config, "vfio.dra.io",
                                              result.request);
  }
  return 0;
}
