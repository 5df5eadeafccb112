#include "base/text.h"

#include <fmt/format.h>

#include <iterator>

namespace vfio_dra {

void AppendHexEscape(std::string& out, unsigned char c) {
  fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
}

std::string EscapeForDisplay(std::string_view value, size_t max_length) {
  std::string out;
  for (unsigned char c : value) {
    if (out.size() >= max_length) {
      out += "...";
      break;
    }
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      AppendHexEscape(out, c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
  }
  return out;
}

}  // namespace vfio_dra
