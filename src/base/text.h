// Text helpers for putting untrusted bytes (claim names, sysfs contents, server messages) into
// messages and logs safely.
#pragma once

#include <string>
#include <string_view>

namespace vfio_dra {

// Appends `c` as "\xNN".
void AppendHexEscape(std::string& out, unsigned char c);

// Escapes bytes outside printable ASCII (and the backslash) as \xNN and truncates to about
// `max_length` characters with "...".
std::string EscapeForDisplay(std::string_view value, size_t max_length = 256);

}  // namespace vfio_dra
