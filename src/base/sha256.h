// Sha256: a SHA-256 digest, for keeping a fixed-size summary of something large (a node scan, a
// published slice) where only "did it change?" is asked later, within one process. Sha1Of is here
// too, for the one place a standard fixes SHA-1 (name-based UUIDs), so that every call into
// OpenSSL's digests, and what its failure means, lives in sha256.cc.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

struct evp_md_ctx_st;

namespace vfio_dra {

using Sha256 = std::array<unsigned char, 32>;
using Sha1 = std::array<unsigned char, 20>;

// OpenSSL fails to digest memory only when it cannot allocate; that throws std::bad_alloc, as
// any other allocation in the process would.
Sha256 Sha256Of(std::string_view data);
// Only where a standard requires SHA-1 (UUID v5, RFC 4122): it no longer resists collisions, so
// nothing that tells content apart may use it. Fails as Sha256Of does.
Sha1 Sha1Of(std::string_view data);

// Digests a sequence of fields without building the serialized form first. Each field is fed
// with its type and (for bytes) its length, so two different sequences of fields never feed the
// same bytes. Single use: Finish() once.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;

  Sha256Stream& Field(std::string_view bytes);
  Sha256Stream& Field(int64_t value);
  Sha256 Finish();

 private:
  void Raw(const void* data, size_t size);
  void Int(int64_t value);
  evp_md_ctx_st* ctx_;
};

}  // namespace vfio_dra
