// Parsers for the kernel's sysfs attribute formats. Each accepts exactly what the kernel writes
// (plus a trailing newline) and rejects anything else, so a malformed file is reported instead of
// being misread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace vfio_dra::sysfs {

// "0x10de\n" -> 0x10de; at most `max_digits` hex digits after the mandatory 0x.
Result<uint32_t> ParseHexAttribute(std::string_view text, int max_digits);
// A decimal integer such as numa_node ("-1\n") or sriov_numvfs ("8\n").
Result<int64_t> ParseDecimalAttribute(std::string_view text);
// A PCI function's `modalias` ("pci:v000010DEd00002230sv000010DEsd00001459bc03sc02i00\n"): its
// IDs and class in one read. Read instead of `uevent`, whose read takes the kernel's device lock
// (see docs/preparation.md).
struct PciModalias {
  uint32_t vendor = 0;
  uint32_t device = 0;
  uint32_t subsystem_vendor = 0;
  uint32_t subsystem_device = 0;
  uint32_t class_code = 0;  // base class, subclass, programming interface
  std::string text;         // without the newline, as modules.alias patterns match it
};
Result<PciModalias> ParsePciModalias(std::string_view text);
// driver_override: "(null)\n" means unset (empty result).
std::string ParseDriverOverride(std::string_view text);
// Hex without 0x, as sriov_vf_device: "154c\n".
Result<uint32_t> ParseBareHex(std::string_view text, int max_digits);

// A PCI address in sysfs form "dddd:bb:dd.f" (the domain may have 4 to 8 hex digits, as VMD
// domains do). Returns the canonical lower-case form with at least 4 domain digits.
Result<std::string> CanonicalBdf(std::string_view text);

// The PCIe root ("pci0000:3a") of a device from its sysfs device path or the target of its
// bus/pci/devices link. The innermost root counts, so a drive behind a VMD controller has its VMD
// domain's root ("pci10000:00"). Empty when the path has none.
std::string PcieRootFromPath(std::string_view path);

// A canonical mdev UUID (8-4-4-4-12 lower-case hex).
bool IsMdevUuid(std::string_view text);

// A name that can be a kernel driver's (letters, digits, '-', '_'; at most 64): it becomes a
// sysfs path (bus/pci/drivers/<name>/bind), so nothing else may pass.
bool IsDriverName(std::string_view text);

// The vendor's own statement of how many instances of an mdev type the parent holds when it is
// otherwise empty, from the type's `description`. NVIDIA writes comma-separated key=value pairs
// ("num_heads=4, frl_config=45, framebuffer=2048M, max_resolution=5120x2880, max_instance=12").
// Absent when the description states nothing (or nothing positive and in range).
std::optional<int> ParseMdevMaxInstance(std::string_view description);

// One line of an NVIDIA vGPU VF's nvidia/creatable_vgpu_types.
struct CreatableVgpuType {
  int id = 0;
  std::string name;
  bool operator==(const CreatableVgpuType&) const = default;
};
// The types an NVIDIA vGPU VF can take now: the header line "ID    : vGPU Name", then one
// "%-5d : %s" line per type (only the header on a VF that holds a vGPU or a full card). IDs are
// positive decimals; anything else is an error naming the line.
Result<std::vector<CreatableVgpuType>> ParseCreatableVgpuTypes(std::string_view text);

// The fatal PCIe errors the AER driver has counted on a function since it appeared: the
// TOTAL_ERR_FATAL line of `aer_dev_fatal` ("<name> <count>" lines, one per error bit, then the
// total). A file without that line or with a count that is not a decimal is an error naming it.
Result<int64_t> ParseAerFatalTotal(std::string_view text);

// A network interface's `operstate` says its link is down ("down", "lowerlayerdown"); "up",
// "unknown" (drivers that do not report it), "dormant" and "testing" are not down.
bool OperstateIsDown(std::string_view text);

}  // namespace vfio_dra::sysfs
