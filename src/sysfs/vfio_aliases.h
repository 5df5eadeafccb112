// VfioAliases: the kernel's table of VFIO variant drivers, read from modules.alias. A variant
// driver (mlx5_vfio_pci, nvgrace_gpu_vfio_pci, ...) declares the devices it serves with
// `alias vfio_pci:<pattern> <module>` lines; their patterns are the PCI modalias with shell
// wildcards, matched against a function's own `modalias` (minus its "pci:" prefix). When several
// patterns match, the one with the fewest wildcards is the most specific and wins, as userspace
// that picks variant drivers (libvirt, NVIDIA's passthrough tooling) does. A function no pattern
// matches uses plain vfio-pci.
//
// Module names use underscores; the driver a module registers may be spelt with dashes
// (nvgrace_gpu_vfio_pci registers nvgrace-gpu-vfio-pci), so resolving a module to a driver name
// is the caller's job (see discovery/vfio_driver_choice.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace vfio_dra::sysfs {

struct VfioAlias {
  std::string pattern;  // e.g. "v000015B3d0000101Esv*sd*bc*sc*i*"
  std::string module;   // e.g. "mlx5_vfio_pci"
  bool operator==(const VfioAlias&) const = default;
};

class VfioAliases {
 public:
  VfioAliases() = default;
  explicit VfioAliases(std::vector<VfioAlias> aliases) : aliases_(std::move(aliases)) {}

  // The `alias vfio_pci:` lines of a modules.alias text; every other line is ignored. `where`
  // names the source in errors (a vfio_pci line without a module).
  static Result<VfioAliases> Parse(std::string_view text, const std::string& where);
  // Reads `path`; a missing file is an empty table (no variant drivers known).
  static Result<VfioAliases> Load(const std::string& path);

  // The module of the most specific pattern matching `modalias` ("pci:v...d...sv...", as sysfs
  // writes it, trailing newline allowed); nothing when none matches.
  std::optional<std::string> BestModule(std::string_view modalias) const;

  const std::vector<VfioAlias>& entries() const { return aliases_; }
  bool empty() const { return aliases_.empty(); }

 private:
  std::vector<VfioAlias> aliases_;
};

}  // namespace vfio_dra::sysfs
