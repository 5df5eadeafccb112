// Text helpers for putting untrusted bytes (claim names, sysfs contents, server messages) into
// messages and logs safely.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vfio_dra {

// Appends `c` as "\xNN".
void AppendHexEscape(std::string& out, unsigned char c);

// Escapes bytes outside printable ASCII (and the backslash) as \xNN and truncates to about
// `max_length` characters with "...".
std::string EscapeForDisplay(std::string_view value, size_t max_length = 256);

// The parts separated by `separator`.
std::string Join(const std::vector<std::string>& parts, std::string_view separator);

}  // namespace vfio_dra
