#include "slicepublisher/device_names.h"

#include <fmt/format.h>

#include <array>

#include "base/sha256.h"

namespace vfio_dra::slicepublisher {
namespace {

// The UUID v5 namespace of vfio-dra mdev instances (a random UUID fixed forever).
constexpr std::array<unsigned char, 16> kMdevNamespace = {
    0x6f, 0x1b, 0x2c, 0x8e, 0x4d, 0x93, 0x4a, 0x57, 0x9b, 0x1e, 0x3c, 0x70, 0xd5, 0x0a, 0x61, 0x2f};

std::string ShortHash(const std::string& text) {
  const Sha1 digest = Sha1Of(text);
  return fmt::format("{:02x}{:02x}{:02x}{:02x}", digest[0], digest[1], digest[2], digest[3]);
}

std::string AddressPart(const std::string& address) {
  std::string out = address;
  for (char& c : out) {
    if (c == ':' || c == '.') c = '-';
  }
  return out;
}

}  // namespace

std::string ToDnsLabel(const std::string& text, size_t max) {
  std::string out;
  bool changed = false;
  for (char c : text) {
    char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if (lower != c) changed = true;
    if ((lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9')) {
      out += lower;
    } else {
      if (c != '-') changed = true;
      if (!out.empty() && out.back() != '-') out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') {
    out.pop_back();
    changed = true;
  }
  if (out.size() > max) changed = true;
  if (!changed && !out.empty()) return out;
  const std::string hash = ShortHash(text);
  const size_t keep = max > hash.size() + 1 ? max - hash.size() - 1 : 0;
  if (out.size() > keep) out.resize(keep);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? hash : out + "-" + hash;
}

std::string PciDeviceName(discovery::DeviceKind kind, const std::string& address) {
  return std::string(discovery::DeviceKindName(kind)) + "-" + AddressPart(address);
}

std::string MdevDeviceName(const std::string& parent, const std::string& type_id, int index) {
  const std::string suffix = "-" + std::to_string(index);
  return ToDnsLabel("mdev-" + AddressPart(parent) + "-" + type_id, 63 - suffix.size()) + suffix;
}

std::string ForeignMdevDeviceName(const std::string& uuid) { return "mdev-" + uuid; }

std::string VgpuDeviceName(const std::string& vf, int type_id) {
  return PciDeviceName(discovery::DeviceKind::kVgpu, vf) + "-" + std::to_string(type_id);
}

std::string VgpuGpuCounterSetName(const std::string& pf) { return "vgpu-gpu-" + AddressPart(pf); }

std::string CounterSetName(const std::string& parent, bool parent_is_pci) {
  return parent_is_pci ? "gpu-" + AddressPart(parent) : ToDnsLabel("mdev-parent-" + parent);
}

std::string MdevInstanceUuid(const std::string& node, const std::string& parent,
                             const std::string& type_id, int index) {
  std::string input(kMdevNamespace.begin(), kMdevNamespace.end());
  input += node + "/" + parent + "/" + type_id + "/" + std::to_string(index);
  Sha1 digest = Sha1Of(input);
  digest[6] = static_cast<unsigned char>((digest[6] & 0x0f) | 0x50);  // version 5
  digest[8] = static_cast<unsigned char>((digest[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    hex += fmt::format("{:02x}", digest[static_cast<size_t>(i)]);
  }
  return hex;
}

}  // namespace vfio_dra::slicepublisher
