#include "sysfs/vfio_aliases.h"

#include <fnmatch.h>

#include <algorithm>

#include "base/file_io.h"

namespace vfio_dra::sysfs {
namespace {

constexpr std::string_view kLinePrefix = "alias vfio_pci:";

std::string_view Trim(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\t' ||
                           text.back() == '\r')) {
    text.remove_suffix(1);
  }
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  return text;
}

}  // namespace

Result<VfioAliases> VfioAliases::Parse(std::string_view text, const std::string& where) {
  std::vector<VfioAlias> aliases;
  size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    std::string_view line = Trim(text.substr(0, end));
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (line.substr(0, kLinePrefix.size()) != kLinePrefix) continue;
    line.remove_prefix(kLinePrefix.size());
    const size_t space = line.find_first_of(" \t");
    const std::string_view module =
        space == std::string_view::npos ? std::string_view() : Trim(line.substr(space + 1));
    if (space == 0 || module.empty() || module.find_first_of(" \t") != std::string_view::npos) {
      return MakeError(ErrorKind::kInvalidArgument,
                       where + ":" + std::to_string(line_number) +
                           ": expected \"alias vfio_pci:<pattern> <module>\"");
    }
    aliases.push_back({std::string(line.substr(0, space)), std::string(module)});
  }
  return VfioAliases(std::move(aliases));
}

Result<VfioAliases> VfioAliases::Load(const std::string& path) {
  auto text = ReadFileToString(path, 64 << 20);
  if (!text.ok()) {
    if (text.error().kind == ErrorKind::kNotFound) return VfioAliases();
    return text.error().Wrap("cannot read the kernel's module aliases");
  }
  return Parse(*text, path);
}

std::optional<std::string> VfioAliases::BestModule(std::string_view modalias) const {
  modalias = Trim(modalias);
  if (modalias.substr(0, 4) != "pci:") return std::nullopt;
  const std::string subject(modalias.substr(4));
  const VfioAlias* best = nullptr;
  long best_wildcards = 0;
  for (const VfioAlias& alias : aliases_) {
    if (fnmatch(alias.pattern.c_str(), subject.c_str(), 0) != 0) continue;
    const long wildcards = std::count(alias.pattern.begin(), alias.pattern.end(), '*');
    // Ties keep the first line, so the answer does not depend on anything but the file.
    if (best == nullptr || wildcards < best_wildcards) {
      best = &alias;
      best_wildcards = wildcards;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->module;
}

}  // namespace vfio_dra::sysfs
