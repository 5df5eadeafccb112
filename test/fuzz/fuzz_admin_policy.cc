// The admin policy file (--config, a ConfigMap on the node).
#include <string>

#include "discovery/admin_policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)vfio_dra::discovery::ParseAdminPolicy(text, "/fuzz/policy.yaml");
  return 0;
}
