#include "base/sha256.h"

#include <openssl/evp.h>

#include <new>

namespace vfio_dra {
namespace {

// Digest must be exactly as large as md's output: EVP_Digest writes that many bytes.
template <typename Digest>
Digest OneShotDigest(const EVP_MD* md, std::string_view data) {
  Digest digest{};
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest.data(), &length, md, nullptr) != 1) {
    throw std::bad_alloc();
  }
  return digest;
}

}  // namespace

Sha256 Sha256Of(std::string_view data) { return OneShotDigest<Sha256>(EVP_sha256(), data); }

Sha1 Sha1Of(std::string_view data) { return OneShotDigest<Sha1>(EVP_sha1(), data); }

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) throw std::bad_alloc();
  if (EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw std::bad_alloc();
  }
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(ctx_); }

void Sha256Stream::Raw(const void* data, size_t size) {
  if (EVP_DigestUpdate(ctx_, data, size) != 1) throw std::bad_alloc();
}

void Sha256Stream::Int(int64_t value) {
  std::array<unsigned char, 8> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(value) >> (8 * i));
  }
  Raw(bytes.data(), bytes.size());
}

Sha256Stream& Sha256Stream::Field(std::string_view bytes) {
  Raw("s", 1);
  Int(static_cast<int64_t>(bytes.size()));
  Raw(bytes.data(), bytes.size());
  return *this;
}

Sha256Stream& Sha256Stream::Field(int64_t value) {
  Raw("i", 1);
  Int(value);
  return *this;
}

Sha256 Sha256Stream::Finish() {
  Sha256 digest{};
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx_, digest.data(), &length) != 1) throw std::bad_alloc();
  return digest;
}

}  // namespace vfio_dra
