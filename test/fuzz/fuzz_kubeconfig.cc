// kubeconfig files (--kubeconfig, $KUBECONFIG).
#include <string>

#include "kube/client_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)vfio_dra::kube::ParseKubeconfig(text, "/fuzz/kubeconfig");
  return 0;
}
