#include "discovery/admin_policy.h"

#include <yaml-cpp/yaml.h>

#include "base/file_io.h"
#include "sysfs/sysfs_parse.h"

namespace vfio_dra::discovery {
namespace {

Error PolicyError(const std::string& path, const YAML::Node& node, const std::string& key,
                  const std::string& problem) {
  std::string where = path;
  if (node.Mark().line >= 0) where += ":" + std::to_string(node.Mark().line + 1);
  return MakeError(ErrorKind::kInvalidArgument,
                   "invalid policy " + where + ": " + key + ": " + problem);
}

// Values of a field that may be a scalar or a list of scalars.
Result<std::vector<std::pair<std::string, YAML::Node>>> Scalars(const std::string& path,
                                                                const YAML::Node& node,
                                                                const std::string& key) {
  std::vector<std::pair<std::string, YAML::Node>> out;
  if (node.IsScalar()) {
    out.emplace_back(node.as<std::string>(), node);
  } else if (node.IsSequence() && node.size() > 0) {
    for (const YAML::Node& item : node) {
      if (!item.IsScalar()) return PolicyError(path, item, key, "list items must be strings");
      out.emplace_back(item.as<std::string>(), item);
    }
  } else {
    return PolicyError(path, node, key, "must be a string or a non-empty list of strings");
  }
  return out;
}

Result<uint32_t> HexId(const std::string& path, const YAML::Node& node, const std::string& key,
                       const std::string& text, int digits) {
  std::string body = text;
  if (body.rfind("0x", 0) == 0 || body.rfind("0X", 0) == 0) body = body.substr(2);
  auto value = sysfs::ParseBareHex(body, digits);
  if (!value.ok() || body.size() != static_cast<size_t>(digits)) {
    return PolicyError(path, node, key,
                       "\"" + text + "\" is not " + std::to_string(digits) + " hex digits");
  }
  return value;
}

Result<bool> Bool(const std::string& path, const YAML::Node& node, const std::string& key) {
  if (node.IsScalar()) {
    const std::string text = node.as<std::string>();
    if (text == "true") return true;
    if (text == "false") return false;
  }
  return PolicyError(path, node, key, "must be true or false");
}

Result<DeviceKind> Kind(const std::string& path, const YAML::Node& node, const std::string& key) {
  const std::string text = node.IsScalar() ? node.as<std::string>() : "";
  if (text == "gpu") return DeviceKind::kGpu;
  if (text == "mdev") return DeviceKind::kMdev;
  if (text == "vf") return DeviceKind::kVf;
  if (text == "hostdev") return DeviceKind::kHostdev;
  if (text == "vgpu") return DeviceKind::kVgpu;
  return PolicyError(path, node, key, "must be one of gpu, mdev, vf, hostdev, vgpu");
}

Result<DeviceSelector> ParseSelector(const std::string& path, const YAML::Node& node,
                                     const std::string& where, bool kind_required) {
  if (!node.IsMap()) return PolicyError(path, node, where, "must be a mapping");
  DeviceSelector selector;
  selector.where = where;
  bool any_field = false;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string field = where + "." + key;
    const YAML::Node& value = kv.second;
    if (key == "kind") {
      auto kind = Kind(path, value, field);
      if (!kind.ok()) return kind.error();
      selector.kind = *kind;
      continue;
    }
    auto values = Scalars(path, value, field);
    if (!values.ok()) return values.error();
    any_field = true;
    for (const auto& [text, item] : *values) {
      if (key == "vendor" || key == "device") {
        auto id = HexId(path, item, field, text, 4);
        if (!id.ok()) return id.error();
        (key == "vendor" ? selector.vendors : selector.devices).insert(*id);
      } else if (key == "class") {
        std::string body = text.rfind("0x", 0) == 0 ? text.substr(2) : text;
        if (body.size() != 4 && body.size() != 6) {
          return PolicyError(path, item, field,
                             "\"" + text + "\" must be 4 (class+subclass) or 6 hex digits");
        }
        auto id = HexId(path, item, field, body, static_cast<int>(body.size()));
        if (!id.ok()) return id.error();
        selector.classes.insert(body.size() == 6 ? (*id | 0x1000000u) : *id);
      } else if (key == "address" || key == "pf") {
        auto bdf = sysfs::CanonicalBdf(text);
        if (!bdf.ok()) {
          return PolicyError(path, item, field,
                             "\"" + text +
                                 "\" is not a PCI address "
                                 "(dddd:bb:dd.f)");
        }
        (key == "address" ? selector.addresses : selector.pfs).insert(*bdf);
      } else if (key == "driver") {
        selector.drivers.insert(text);
      } else if (key == "mdevType") {
        selector.mdev_types.insert(text);
      } else if (key == "vgpuType") {
        selector.vgpu_types.insert(text);
      } else {
        return PolicyError(path, kv.first, field,
                           "unknown key (known: kind, vendor, device, class, address, pf, driver, "
                           "mdevType, vgpuType)");
      }
    }
  }
  if (kind_required && !selector.kind.has_value()) {
    return PolicyError(path, node, where + ".kind", "is required (gpu, mdev, vf, hostdev or vgpu)");
  }
  if (!any_field && kind_required) {
    return PolicyError(path, node, where,
                       "selects every device of its kind; name at least one of vendor, device, "
                       "class, address, pf, driver, mdevType, vgpuType");
  }
  if (!any_field && !kind_required && !selector.kind.has_value()) {
    return PolicyError(path, node, where, "is empty and would deny everything");
  }
  if (!selector.pfs.empty() && selector.kind.has_value() && *selector.kind != DeviceKind::kVf &&
      *selector.kind != DeviceKind::kVgpu) {
    return PolicyError(path, node, where + ".pf", "only applies to kinds vf and vgpu");
  }
  if (!selector.vgpu_types.empty() && selector.kind.has_value() &&
      *selector.kind != DeviceKind::kVgpu) {
    return PolicyError(path, node, where + ".vgpuType", "only applies to kind vgpu");
  }
  if (!selector.mdev_types.empty() && selector.kind.has_value() &&
      *selector.kind != DeviceKind::kMdev) {
    return PolicyError(path, node, where + ".mdevType", "only applies to kind mdev");
  }
  // Nothing is both an mdev type and a vGPU type: such an entry would silently do nothing.
  if (!selector.mdev_types.empty() && !selector.vgpu_types.empty()) {
    return PolicyError(path, node, where,
                       "names both mdevType and vgpuType and so can never match anything; split "
                       "it into one entry per kind");
  }
  return selector;
}

Result<VfioDriverRule> ParseVfioDriverRule(const std::string& path, const YAML::Node& node,
                                           const std::string& where) {
  if (!node.IsMap()) return PolicyError(path, node, where, "must be a mapping");
  VfioDriverRule rule;
  bool has_match = false;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key == "match") {
      has_match = true;
      const YAML::Node& match = kv.second;
      if (match.IsMap() && match.size() == 0) {
        rule.match.where = where + ".match";  // every function
        continue;
      }
      auto selector = ParseSelector(path, match, where + ".match", false);
      if (!selector.ok()) return selector.error();
      if (!selector->mdev_types.empty()) {
        return PolicyError(path, match, where + ".match.mdevType",
                           "does not apply: mdevs have no VFIO driver of their own");
      }
      if (!selector->vgpu_types.empty()) {
        return PolicyError(path, match, where + ".match.vgpuType",
                           "does not apply: a vGPU VF stays on nvidia, its VFIO provider");
      }
      rule.match = std::move(*selector);
    } else if (key == "use") {
      if (!kv.second.IsScalar()) {
        return PolicyError(path, kv.second, where + ".use", "must be a name");
      }
      rule.use = kv.second.as<std::string>();
      if (!sysfs::IsDriverName(rule.use)) {
        return PolicyError(path, kv.second, where + ".use",
                           "\"" + rule.use +
                               "\" is not a driver name (letters, digits, - and _; e.g. vfio-pci, "
                               "mlx5_vfio_pci)");
      }
    } else {
      return PolicyError(path, kv.first, where + "." + key, "unknown key (known: match, use)");
    }
  }
  if (!has_match) {
    return PolicyError(path, node, where + ".match", "is required ({} for every function)");
  }
  if (rule.use.empty()) return PolicyError(path, node, where + ".use", "is required");
  return rule;
}

// The largest count a layout may declare: more VFs than any GPU has.
constexpr int kMaxLayoutCount = 4096;

Result<std::optional<int>> LayoutCount(const std::string& path, const YAML::Node& node,
                                       const std::string& key) {
  const std::string text = node.IsScalar() ? node.as<std::string>() : "";
  if (text == "max") return std::optional<int>();
  auto value = sysfs::ParseDecimalAttribute(text);
  if (!value.ok() || *value < 1 || *value > kMaxLayoutCount) {
    return PolicyError(
        path, node, key,
        "must be max or a whole number from 1 to " + std::to_string(kMaxLayoutCount));
  }
  return std::optional<int>(static_cast<int>(*value));
}

Status ParseLayoutMatch(const std::string& path, const YAML::Node& match, const std::string& where,
                        VgpuLayout& layout) {
  if (match.IsMap() && match.size() == 0) {
    return PolicyError(path, match, where,
                       "selects no GPU; name at least one of address, vendor, device, class, "
                       "driver");
  }
  auto selector = ParseSelector(path, match, where, false);
  if (!selector.ok()) return selector.error();
  const char* stray = selector->kind.has_value()      ? "kind"
                      : !selector->pfs.empty()        ? "pf"
                      : !selector->mdev_types.empty() ? "mdevType"
                      : !selector->vgpu_types.empty() ? "vgpuType"
                                                      : nullptr;
  if (stray != nullptr) {
    return PolicyError(path, match, where + "." + stray,
                       "does not apply: match selects the GPU (the PF) by address, vendor, device, "
                       "class or driver; the type is the layout's vgpuType");
  }
  layout.match = std::move(*selector);
  return Status::Ok();
}

Result<VgpuLayout> ParseVgpuLayout(const std::string& path, const YAML::Node& node,
                                   const std::string& where) {
  if (!node.IsMap()) return PolicyError(path, node, where, "must be a mapping");
  VgpuLayout layout;
  layout.where = where;
  bool has_match = false;
  bool has_count = false;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string field = where + "." + key;
    const YAML::Node& value = kv.second;
    if (key == "match") {
      has_match = true;
      if (Status s = ParseLayoutMatch(path, value, field, layout); !s.ok()) return s.error();
    } else if (key == "vgpuType") {
      if (!value.IsScalar() || value.as<std::string>().empty()) {
        return PolicyError(path, value, field, "must be a type ID or name");
      }
      layout.vgpu_type = value.as<std::string>();
    } else if (key == "count") {
      auto count = LayoutCount(path, value, field);
      if (!count.ok()) return count.error();
      layout.count = *count;
      has_count = true;
    } else if (key == "create") {
      const std::string text = value.IsScalar() ? value.as<std::string>() : "";
      if (text != "ahead" && text != "onDemand") {
        return PolicyError(path, value, field, "must be ahead or onDemand");
      }
      layout.create = text == "ahead" ? VgpuCreation::kAhead : VgpuCreation::kOnDemand;
    } else {
      return PolicyError(path, kv.first, field,
                         "unknown key (known: match, vgpuType, count, create)");
    }
  }
  if (!has_match) return PolicyError(path, node, where + ".match", "is required");
  if (layout.vgpu_type.empty()) return PolicyError(path, node, where + ".vgpuType", "is required");
  if (!has_count) {
    return PolicyError(path, node, where + ".count", "is required (a number, or max)");
  }
  return layout;
}

bool MatchesClass(const DeviceSelector& s, uint32_t class_code) {
  if (s.classes.empty()) return true;
  return s.classes.count(class_code >> 8) > 0 || s.classes.count(class_code | 0x1000000u) > 0;
}

}  // namespace

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kGpu:
      return "gpu";
    case DeviceKind::kMdev:
      return "mdev";
    case DeviceKind::kVf:
      return "vf";
    case DeviceKind::kHostdev:
      return "hostdev";
    case DeviceKind::kVgpu:
      return "vgpu";
  }
  return "unknown";
}

bool DeviceSelector::MatchesFunction(const PciFunction& fn) const {
  if (!mdev_types.empty() || !vgpu_types.empty()) return false;
  return MatchesPciFields(fn);
}

bool DeviceSelector::MatchesPciFields(const PciFunction& fn) const {
  if (!vendors.empty() && !vendors.count(fn.vendor_id)) return false;
  if (!devices.empty() && !devices.count(fn.device_id)) return false;
  if (!MatchesClass(*this, fn.class_code)) return false;
  if (!addresses.empty() && !addresses.count(fn.address)) return false;
  if (!drivers.empty() && !drivers.count(fn.driver)) return false;
  if (!pfs.empty() && (!fn.sriov_vf.has_value() || !pfs.count(fn.sriov_vf->pf))) return false;
  return true;
}

bool DeviceSelector::MatchesMdev(const std::string& type_id, const PciFunction* parent) const {
  if (!mdev_types.empty() && !mdev_types.count(type_id)) return false;
  const bool needs_parent = !vendors.empty() || !devices.empty() || !classes.empty() ||
                            !addresses.empty() || !drivers.empty() || !pfs.empty();
  if (!needs_parent) return true;
  return parent != nullptr && MatchesPciFields(*parent);
}

bool DeviceSelector::MatchesVgpu(const sysfs::CreatableVgpuType& type,
                                 const PciFunction& vf) const {
  if (!mdev_types.empty()) return false;
  if (!vgpu_types.empty() && !vgpu_types.count(std::to_string(type.id)) &&
      !vgpu_types.count(type.name)) {
    return false;
  }
  return MatchesPciFields(vf);
}

bool VgpuLayout::MatchesType(const sysfs::CreatableVgpuType& type) const {
  return vgpu_type == std::to_string(type.id) || vgpu_type == type.name;
}

const VgpuLayout* AdminPolicy::VgpuLayoutFor(const PciFunction& pf) const {
  for (const VgpuLayout& layout : vgpu_layouts) {
    if (layout.match.MatchesFunction(pf)) return &layout;
  }
  return nullptr;
}

bool AdminPolicy::KindEnabled(DeviceKind kind) const {
  switch (kind) {
    case DeviceKind::kGpu:
      return gpu_enabled;
    case DeviceKind::kMdev:
      return mdev_enabled;
    case DeviceKind::kVf:
      return vf_enabled;
    case DeviceKind::kHostdev:
      return hostdev_enabled;
    case DeviceKind::kVgpu:
      return vgpu_enabled;
  }
  return false;
}

bool AdminPolicy::HasSelectorsFor(DeviceKind kind) const {
  for (const auto& s : select) {
    if (s.kind == kind) return true;
  }
  return false;
}

Result<AdminPolicy> ParseAdminPolicy(const std::string& yaml_text, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    std::string where = path;
    if (e.mark.line >= 0) where += ":" + std::to_string(e.mark.line + 1);
    return MakeError(ErrorKind::kInvalidArgument, "invalid policy " + where + ": " + e.msg);
  }
  AdminPolicy policy;
  policy.source = path;
  if (root.IsNull()) return policy;  // an empty file is the default policy
  if (!root.IsMap()) return PolicyError(path, root, "(document)", "must be a mapping");
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& value = kv.second;
      if (key == "version") {
        if (!value.IsScalar() || value.as<std::string>() != "v1") {
          return PolicyError(path, value, key, "must be v1");
        }
      } else if (key == "kinds") {
        if (!value.IsMap()) return PolicyError(path, value, key, "must be a mapping");
        for (const auto& kind_kv : value) {
          const std::string name = kind_kv.first.as<std::string>();
          auto kind = Kind(path, kind_kv.first, "kinds." + name);
          if (!kind.ok()) return kind.error();
          YAML::Node flag = kind_kv.second;
          if (flag.IsMap()) {
            for (const auto& inner : flag) {
              if (inner.first.as<std::string>() != "enabled") {
                return PolicyError(path, inner.first,
                                   "kinds." + name + "." + inner.first.as<std::string>(),
                                   "unknown key (known: enabled)");
              }
            }
            flag = flag["enabled"];
          }
          auto enabled = Bool(path, flag, "kinds." + name);
          if (!enabled.ok()) return enabled.error();
          switch (*kind) {
            case DeviceKind::kGpu:
              policy.gpu_enabled = *enabled;
              break;
            case DeviceKind::kMdev:
              policy.mdev_enabled = *enabled;
              break;
            case DeviceKind::kVf:
              policy.vf_enabled = *enabled;
              break;
            case DeviceKind::kHostdev:
              policy.hostdev_enabled = *enabled;
              break;
            case DeviceKind::kVgpu:
              policy.vgpu_enabled = *enabled;
              break;
          }
        }
      } else if (key == "select" || key == "deny") {
        if (!value.IsSequence()) return PolicyError(path, value, key, "must be a list");
        for (size_t i = 0; i < value.size(); ++i) {
          auto selector =
              ParseSelector(path, value[i], key + "[" + std::to_string(i) + "]", key == "select");
          if (!selector.ok()) return selector.error();
          (key == "select" ? policy.select : policy.deny).push_back(std::move(*selector));
        }
      } else if (key == "vfioDrivers") {
        if (!value.IsSequence()) return PolicyError(path, value, key, "must be a list");
        for (size_t i = 0; i < value.size(); ++i) {
          auto rule = ParseVfioDriverRule(path, value[i], key + "[" + std::to_string(i) + "]");
          if (!rule.ok()) return rule.error();
          policy.vfio_drivers.push_back(std::move(*rule));
        }
      } else if (key == "vgpuLayouts") {
        if (!value.IsSequence()) return PolicyError(path, value, key, "must be a list");
        for (size_t i = 0; i < value.size(); ++i) {
          auto layout = ParseVgpuLayout(path, value[i], key + "[" + std::to_string(i) + "]");
          if (!layout.ok()) return layout.error();
          policy.vgpu_layouts.push_back(std::move(*layout));
        }
      } else if (key == "unsafeNoIommu") {
        auto flag = Bool(path, value, key);
        if (!flag.ok()) return flag.error();
        policy.unsafe_no_iommu = *flag;
      } else {
        return PolicyError(
            path, kv.first, key,
            "unknown key (known: version, kinds, select, deny, vfioDrivers, vgpuLayouts, "
            "unsafeNoIommu)");
      }
    }
  } catch (const YAML::Exception& e) {
    return PolicyError(path, root, "(document)", e.msg);
  }
  return policy;
}

Result<AdminPolicy> LoadAdminPolicy(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) return text.error().Wrap("cannot load the admin policy");
  return ParseAdminPolicy(*text, path);
}

}  // namespace vfio_dra::discovery
