#include "base/base64.h"

#include <array>

namespace vfio_dra {
namespace {

constexpr std::array<int, 256> MakeTable() {
  std::array<int, 256> table{};
  for (int& v : table) v = -1;
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) table[static_cast<unsigned char>(alphabet[i])] = i;
  return table;
}

}  // namespace

Result<std::string> Base64Decode(std::string_view encoded) {
  static constexpr std::array<int, 256> kTable = MakeTable();
  std::string out;
  out.reserve(encoded.size() * 3 / 4);
  unsigned int accumulator = 0;
  int bits = 0;
  bool padding_seen = false;
  for (size_t i = 0; i < encoded.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(encoded[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding_seen = true;
      continue;
    }
    int value = kTable[c];
    if (value < 0 || padding_seen) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "invalid base64: unexpected character at offset " + std::to_string(i));
    }
    accumulator = (accumulator << 6) | static_cast<unsigned int>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((accumulator >> bits) & 0xff);
    }
  }
  if (bits >= 6) {
    return MakeError(ErrorKind::kInvalidArgument, "invalid base64: truncated input");
  }
  return out;
}

}  // namespace vfio_dra
