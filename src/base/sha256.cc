#include "base/sha256.h"

#include <openssl/evp.h>

namespace vfio_dra {

Sha256 Sha256Of(std::string_view data) {
  Sha256 digest{};
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr);
  return digest;
}

}  // namespace vfio_dra
