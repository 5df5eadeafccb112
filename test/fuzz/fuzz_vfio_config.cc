// Opaque VfioConfig parameters from DeviceClasses and claims.
#include <nlohmann/json.hpp>

#include "prepare/vfio_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  vfio_dra::prepare::VfioConfig config;
  (void)vfio_dra::prepare::DecodeVfioConfig(json, "vfio.dra.io", config);
  return 0;
}
