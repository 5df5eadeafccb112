// Standard (RFC 4648) base64 decoding, as kubeconfig "-data" fields use it.
#pragma once

#include <string>
#include <string_view>

#include "base/result.h"

namespace vfio_dra {

// Decodes padded or unpadded base64; whitespace is ignored. Fails on any other character.
Result<std::string> Base64Decode(std::string_view encoded);

}  // namespace vfio_dra
