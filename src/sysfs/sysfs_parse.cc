#include "sysfs/sysfs_parse.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "base/text.h"

namespace vfio_dra::sysfs {
namespace {

std::string_view TrimNewline(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  return text;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Error Malformed(std::string_view what, std::string_view text) {
  return MakeError(ErrorKind::kInvalidArgument,
                   std::string(what) + ", got \"" + EscapeForDisplay(text, 64) + "\"");
}

Result<uint32_t> ParseHexDigits(std::string_view digits, int max_digits, std::string_view text) {
  if (digits.empty() || digits.size() > static_cast<size_t>(max_digits)) {
    return Malformed("expected 1 to " + std::to_string(max_digits) + " hex digits", text);
  }
  uint32_t value = 0;
  for (char c : digits) {
    const int v = HexValue(c);
    if (v < 0) return Malformed("expected hex digits", text);
    value = (value << 4) | static_cast<uint32_t>(v);
  }
  return value;
}

}  // namespace

Result<uint32_t> ParseHexAttribute(std::string_view text, int max_digits) {
  const std::string_view body = TrimNewline(text);
  if (body.size() < 3 || body[0] != '0' || (body[1] != 'x' && body[1] != 'X')) {
    return Malformed("expected 0x followed by hex digits", text);
  }
  return ParseHexDigits(body.substr(2), max_digits, text);
}

Result<uint32_t> ParseBareHex(std::string_view text, int max_digits) {
  return ParseHexDigits(TrimNewline(text), max_digits, text);
}

Result<int64_t> ParseDecimalAttribute(std::string_view text) {
  const std::string_view body = TrimNewline(text);
  if (body.empty() || body.size() > 19) return Malformed("expected a decimal integer", text);
  size_t i = 0;
  bool negative = false;
  if (body[0] == '-') {
    negative = true;
    i = 1;
  }
  if (i == body.size()) return Malformed("expected a decimal integer", text);
  int64_t value = 0;
  for (; i < body.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(body[i]))) {
      return Malformed("expected a decimal integer", text);
    }
    value = value * 10 + (body[i] - '0');
  }
  return negative ? -value : value;
}

Result<PciModalias> ParsePciModalias(std::string_view text) {
  const std::string_view body = TrimNewline(text);
  const auto malformed = [&] {
    return Malformed("expected pci:v<8 hex>d<8 hex>sv<8 hex>sd<8 hex>bc<2 hex>sc<2 hex>i<2 hex>",
                     text);
  };
  // Each field: its prefix, then exactly the kernel's number of upper-case hex digits.
  struct Field {
    std::string_view prefix;
    size_t digits;
    uint32_t* value;
  };
  PciModalias out;
  uint32_t base = 0;
  uint32_t sub = 0;
  uint32_t interface = 0;
  const Field fields[] = {{"pci:v", 8, &out.vendor},
                          {"d", 8, &out.device},
                          {"sv", 8, &out.subsystem_vendor},
                          {"sd", 8, &out.subsystem_device},
                          {"bc", 2, &base},
                          {"sc", 2, &sub},
                          {"i", 2, &interface}};
  std::string_view rest = body;
  for (const Field& field : fields) {
    if (rest.substr(0, field.prefix.size()) != field.prefix) return malformed();
    rest.remove_prefix(field.prefix.size());
    if (rest.size() < field.digits) return malformed();
    uint32_t value = 0;
    for (char c : rest.substr(0, field.digits)) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) ||
          std::islower(static_cast<unsigned char>(c))) {
        return malformed();
      }
      value = (value << 4) | static_cast<uint32_t>(HexValue(c));
    }
    *field.value = value;
    rest.remove_prefix(field.digits);
  }
  if (!rest.empty() || out.vendor > 0xffff || out.device > 0xffff ||
      out.subsystem_vendor > 0xffff || out.subsystem_device > 0xffff) {
    return malformed();
  }
  out.class_code = (base << 16) | (sub << 8) | interface;
  out.text = std::string(body);
  return out;
}

std::string ParseDriverOverride(std::string_view text) {
  const std::string_view body = TrimNewline(text);
  if (body == "(null)") return "";
  return std::string(body);
}

Result<std::string> CanonicalBdf(std::string_view text) {
  // domain:bus:device.function
  const size_t c1 = text.find(':');
  const size_t c2 = c1 == std::string_view::npos ? c1 : text.find(':', c1 + 1);
  const size_t dot = c2 == std::string_view::npos ? c2 : text.find('.', c2 + 1);
  if (dot == std::string_view::npos) {
    return Malformed("expected a PCI address dddd:bb:dd.f", text);
  }
  auto domain = ParseHexDigits(text.substr(0, c1), 8, text);
  auto bus = ParseHexDigits(text.substr(c1 + 1, c2 - c1 - 1), 2, text);
  auto device = ParseHexDigits(text.substr(c2 + 1, dot - c2 - 1), 2, text);
  auto function = ParseHexDigits(text.substr(dot + 1), 1, text);
  if (!domain.ok() || !bus.ok() || !device.ok() || !function.ok() || c1 < 4 || c2 - c1 != 3 ||
      dot - c2 != 3 || text.size() - dot != 2 || *device > 0x1f || *function > 7) {
    return Malformed("expected a PCI address dddd:bb:dd.f", text);
  }
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", *domain, *bus, *device, *function);
}

std::string PcieRootFromPath(std::string_view path) {
  std::string root;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    start = end + 1;
    const size_t colon = part.find(':');
    if (part.size() < 6 || part.substr(0, 3) != "pci" || colon == std::string_view::npos) continue;
    const std::string_view domain = part.substr(3, colon - 3);
    const std::string_view bus = part.substr(colon + 1);
    if (domain.size() < 4 || domain.size() > 8 || bus.size() != 2) continue;
    if (ParseHexDigits(domain, 8, part).ok() && ParseHexDigits(bus, 2, part).ok()) {
      root = std::string(part);
    }
  }
  return root;
}

bool IsMdevUuid(std::string_view text) {
  if (text.size() != 36) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? text[i] != '-'
             : !(std::isdigit(static_cast<unsigned char>(text[i])) ||
                 (text[i] >= 'a' && text[i] <= 'f'))) {
      return false;
    }
  }
  return true;
}

std::optional<int> ParseMdevMaxInstance(std::string_view description) {
  static constexpr std::string_view kKey = "max_instance=";
  size_t at = 0;
  while ((at = description.find(kKey, at)) != std::string_view::npos) {
    // Only a whole key counts: "xmax_instance=" is another key.
    const bool key_start = at == 0 || description[at - 1] == ' ' || description[at - 1] == ',';
    at += kKey.size();
    if (!key_start) continue;
    size_t end = at;
    while (end < description.size() && std::isdigit(static_cast<unsigned char>(description[end]))) {
      ++end;
    }
    const bool value_end = end == description.size() || description[end] == ',' ||
                           description[end] == ' ' || description[end] == '\n';
    if (end == at || end - at > 6 || !value_end) return std::nullopt;
    int value = 0;
    for (size_t i = at; i < end; ++i) value = value * 10 + (description[i] - '0');
    if (value <= 0) return std::nullopt;
    return value;
  }
  return std::nullopt;
}

Result<std::vector<CreatableVgpuType>> ParseCreatableVgpuTypes(std::string_view text) {
  std::vector<CreatableVgpuType> types;
  size_t start = 0;
  bool header = true;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    std::string_view id_text = line.substr(0, colon);
    while (!id_text.empty() && id_text.back() == ' ') id_text.remove_suffix(1);
    if (header) {
      // The header names the columns; a file without it is not the format we know.
      header = false;
      if (id_text == "ID") continue;
      return MakeError(ErrorKind::kInvalidArgument,
                       "creatable_vgpu_types: first line \"" + std::string(line) +
                           "\" is not the header \"ID    : vGPU Name\"");
    }
    auto id = ParseDecimalAttribute(id_text);
    std::string_view name = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (colon == std::string_view::npos || !id.ok() || *id <= 0 || *id > 0x7fffffff ||
        name.empty()) {
      return MakeError(
          ErrorKind::kInvalidArgument,
          "creatable_vgpu_types: line \"" + std::string(line) + "\" is not \"<ID> : <name>\"");
    }
    types.push_back({static_cast<int>(*id), std::string(name)});
  }
  return types;
}

bool IsDriverName(std::string_view text) {
  return !text.empty() && text.size() <= 64 && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_';
  });
}

Result<int64_t> ParseAerFatalTotal(std::string_view text) {
  constexpr std::string_view kTotal = "TOTAL_ERR_FATAL";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.substr(0, kTotal.size()) != kTotal || line.size() == kTotal.size() ||
        line[kTotal.size()] != ' ') {
      continue;
    }
    auto count = ParseDecimalAttribute(line.substr(kTotal.size() + 1));
    if (!count.ok() || *count < 0) {
      return MakeError(ErrorKind::kInvalidArgument, "aer_dev_fatal: line \"" + std::string(line) +
                                                        "\" is not \"" + std::string(kTotal) +
                                                        " <count>\"");
    }
    return *count;
  }
  return MakeError(ErrorKind::kInvalidArgument, "aer_dev_fatal has no TOTAL_ERR_FATAL line");
}

bool OperstateIsDown(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text == "down" || text == "lowerlayerdown";
}

}  // namespace vfio_dra::sysfs
