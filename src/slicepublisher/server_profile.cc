#include "slicepublisher/server_profile.h"

#include <cctype>

namespace vfio_dra::slicepublisher {

CounterLayout ServerProfile::Layout() const {
  if (counters_dropped || kubernetes_minor < 33) return CounterLayout::kNone;
  return kubernetes_minor >= 35 ? CounterLayout::kOwnSlice : CounterLayout::kInDeviceSlice;
}

Result<int> ParseKubernetesMinor(const std::string& version) {
  std::string text = version;
  if (!text.empty() && text[0] == 'v') text = text.substr(1);
  if (text.rfind("1.", 0) != 0) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "Kubernetes version \"" + version + "\" must look like 1.35");
  }
  int minor = 0;
  size_t i = 2;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    minor = minor * 10 + (text[i] - '0');
    if (minor > 1000) break;
  }
  if (i == 2 || minor > 1000 ||
      (i < text.size() && text[i] != '.' && text[i] != '+' && text[i] != '-')) {
    return MakeError(ErrorKind::kInvalidArgument,
                     "Kubernetes version \"" + version + "\" must look like 1.35");
  }
  return minor;
}

}  // namespace vfio_dra::slicepublisher
