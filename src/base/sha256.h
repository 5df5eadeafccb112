// Sha256: a SHA-256 digest, for keeping a fixed-size summary of something large (a node scan, a
// published slice) where only "did it change?" is asked later.
#pragma once

#include <array>
#include <string_view>

namespace vfio_dra {

using Sha256 = std::array<unsigned char, 32>;

Sha256 Sha256Of(std::string_view data);

}  // namespace vfio_dra
