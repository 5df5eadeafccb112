// Sha256: a SHA-256 digest, for keeping a fixed-size summary of something large (a node scan, a
// published slice) where only "did it change?" is asked later.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

struct evp_md_ctx_st;

namespace vfio_dra {

using Sha256 = std::array<unsigned char, 32>;

// A digest that could not be computed (OpenSSL out of memory) equals no other digest, so a
// caller comparing digests sees "changed", never a false "unchanged".
Sha256 Sha256Of(std::string_view data);

// Digests a sequence of fields without building the serialized form first. Every variable-length
// field is length-prefixed, so two different sequences of fields never feed the same bytes.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;

  Sha256Stream& Field(std::string_view bytes);  // length, then the bytes
  Sha256Stream& Field(int64_t value);
  Sha256 Finish();

 private:
  void Raw(const void* data, size_t size);
  evp_md_ctx_st* ctx_;
  bool ok_ = false;
};

}  // namespace vfio_dra
