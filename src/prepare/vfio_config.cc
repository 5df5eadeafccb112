#include "prepare/vfio_config.h"

#include <algorithm>

#include "base/text.h"

namespace vfio_dra::prepare {
namespace {

Error Bad(const std::string& what) {
  return MakeError(ErrorKind::kInvalidArgument, "invalid VfioConfig: " + what);
}

Status DecodeInt(const nlohmann::json& value, const char* key, int max, std::optional<int>& out) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > max) {
    return Bad(std::string(key) + " " + EscapeForDisplay(value.dump(), 80) +
               " is not an integer from 0 to " + std::to_string(max));
  }
  out = value.get<int>();
  return Status::Ok();
}

Status DecodeBool(const nlohmann::json& value, const char* key, std::optional<bool>& out) {
  if (!value.is_boolean()) {
    return Bad(std::string(key) + " " + EscapeForDisplay(value.dump(), 80) +
               " is not true or false");
  }
  out = value.get<bool>();
  return Status::Ok();
}

bool Applies(const kube::DeviceAllocationConfiguration& config, const std::string& request) {
  if (config.requests.empty()) return true;
  const std::string base = kube::BaseRequestName(request);
  return std::any_of(config.requests.begin(), config.requests.end(),
                     [&](const std::string& r) { return r == request || r == base; });
}

}  // namespace

const char* IommuInterfaceName(IommuInterface iommu) {
  switch (iommu) {
    case IommuInterface::kLegacy:
      return "legacy";
    case IommuInterface::kIommufd:
      return "iommufd";
    case IommuInterface::kBoth:
      return "both";
  }
  return "legacy";
}

Status DecodeVfioConfig(const nlohmann::json& parameters, const std::string& driver,
                        VfioConfig& config) {
  if (!parameters.is_object()) return Bad("the parameters must be a JSON object");
  const std::string want_version = driver + "/" + kVfioConfigVersion;
  auto api_version = parameters.find("apiVersion");
  if (api_version == parameters.end() || !api_version->is_string()) {
    return Bad("apiVersion is missing (expected \"" + want_version + "\")");
  }
  if (*api_version != want_version) {
    return Bad("apiVersion \"" + EscapeForDisplay(api_version->get<std::string>(), 80) +
               "\" is not supported (expected \"" + want_version + "\")");
  }
  auto kind = parameters.find("kind");
  if (kind == parameters.end() || !kind->is_string() || *kind != kVfioConfigKind) {
    if (kind == parameters.end()) {
      return Bad(std::string("kind is missing (expected \"") + kVfioConfigKind + "\")");
    }
    const std::string shown = kind->is_string() ? kind->get<std::string>() : kind->dump();
    return Bad("kind \"" + EscapeForDisplay(shown, 80) + "\" is not supported (expected \"" +
               kVfioConfigKind + "\")");
  }
  for (const auto& [key, value] : parameters.items()) {
    if (key == "apiVersion" || key == "kind") continue;
    if (key == "iommuInterface") {
      if (!value.is_string()) return Bad("iommuInterface must be a string");
      const std::string name = value.get<std::string>();
      if (name == "legacy") {
        config.iommu = IommuInterface::kLegacy;
      } else if (name == "iommufd") {
        config.iommu = IommuInterface::kIommufd;
      } else if (name == "both") {
        config.iommu = IommuInterface::kBoth;
      } else {
        return Bad("iommuInterface \"" + EscapeForDisplay(name, 80) +
                   "\" is not one of legacy, iommufd, both");
      }
    } else if (key == "macAddress") {
      auto mac = value.is_string() ? UnicastMac(value.get<std::string>()) : std::nullopt;
      if (!mac) {
        return Bad("macAddress " + EscapeForDisplay(value.dump(), 80) +
                   " is not a unicast MAC address like \"02:00:00:aa:bb:cc\"");
      }
      config.network.mac = *mac;
    } else if (key == "vlan") {
      // 4095 is reserved by 802.1Q; 0 means untagged.
      if (Status s = DecodeInt(value, "vlan", 4094, config.network.vlan); !s.ok()) return s;
    } else if (key == "qos") {
      if (Status s = DecodeInt(value, "qos", 7, config.network.qos); !s.ok()) return s;
    } else if (key == "spoofChk") {
      if (Status s = DecodeBool(value, "spoofChk", config.network.spoof_check); !s.ok()) return s;
    } else if (key == "trust") {
      if (Status s = DecodeBool(value, "trust", config.network.trust); !s.ok()) return s;
    } else {
      return Bad("unknown field \"" + EscapeForDisplay(key, 80) +
                 "\" (known: apiVersion, kind, iommuInterface, macAddress, vlan, qos, spoofChk, "
                 "trust)");
    }
  }
  return Status::Ok();
}

Result<VfioConfig> ConfigForRequest(const std::vector<kube::DeviceAllocationConfiguration>& configs,
                                    const std::string& driver, const std::string& request) {
  VfioConfig config;
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto& entry = configs[i];
    if (!entry.opaque.has_value() || entry.opaque->driver != driver) continue;
    if (!Applies(entry, request)) continue;
    if (Status s = DecodeVfioConfig(entry.opaque->parameters, driver, config); !s.ok()) {
      return s.error().Wrap("status.allocation.config[" + std::to_string(i) + "] (" + entry.source +
                            ")");
    }
  }
  if (config.network.qos.value_or(0) != 0 && config.network.vlan.value_or(0) == 0) {
    return Bad("qos " + std::to_string(*config.network.qos) +
               " needs a vlan: the priority travels in the VLAN tag (set vlan too)")
        .Wrap("request " + request);
  }
  return config;
}

std::optional<std::string> UnicastMac(const std::string& text) {
  auto mac = vfio::NormalizeMac(text);
  if (!mac) return std::nullopt;
  const int first = std::stoi(mac->substr(0, 2), nullptr, 16);
  if ((first & 1) != 0) return std::nullopt;  // multicast
  if (*mac == "00:00:00:00:00:00") return std::nullopt;
  return mac;
}

}  // namespace vfio_dra::prepare
