#include "base/sha256.h"

#include <openssl/evp.h>

#include <atomic>

namespace vfio_dra {
namespace {

// What a digest that could not be computed (OpenSSL out of memory) reads as: different from
// every other digest, so that the caller sees "changed" and rewrites, never "unchanged".
Sha256 Unmatchable() {
  static std::atomic<uint64_t> next{0};
  Sha256 digest{};
  digest.fill(0xff);
  const uint64_t n = next.fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < 8; ++i) digest[i] = static_cast<unsigned char>(n >> (8 * i));
  return digest;
}

}  // namespace

Sha256 Sha256Of(std::string_view data) {
  Sha256 digest{};
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1) {
    return Unmatchable();
  }
  return digest;
}

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  ok_ = ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1;
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(ctx_); }

void Sha256Stream::Raw(const void* data, size_t size) {
  ok_ = ok_ && EVP_DigestUpdate(ctx_, data, size) == 1;
}

Sha256Stream& Sha256Stream::Field(std::string_view bytes) {
  Field(static_cast<int64_t>(bytes.size()));
  Raw(bytes.data(), bytes.size());
  return *this;
}

Sha256Stream& Sha256Stream::Field(int64_t value) {
  // Little-endian whatever the host, so a digest means the same on every node.
  std::array<unsigned char, 8> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(value) >> (8 * i));
  }
  Raw(bytes.data(), bytes.size());
  return *this;
}

Sha256 Sha256Stream::Finish() {
  Sha256 digest{};
  unsigned int length = 0;
  if (!ok_ || EVP_DigestFinal_ex(ctx_, digest.data(), &length) != 1) return Unmatchable();
  return digest;
}

}  // namespace vfio_dra
