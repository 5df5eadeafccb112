#include "prepare/vfio_config.h"

#include <algorithm>
#include <cctype>

#include "base/text.h"

namespace vfio_dra::prepare {
namespace {

Error Bad(const std::string& what) {
  return MakeError(ErrorKind::kInvalidArgument, "invalid VfioConfig: " + what);
}

bool IsUnicastMac(const std::string& mac) {
  if (mac.size() != 17) return false;
  for (size_t i = 0; i < mac.size(); ++i) {
    const bool colon = i % 3 == 2;
    if (colon ? mac[i] != ':' : !std::isxdigit(static_cast<unsigned char>(mac[i]))) return false;
  }
  const int first = std::stoi(mac.substr(0, 2), nullptr, 16);
  if ((first & 1) != 0) return false;  // multicast
  return mac != "00:00:00:00:00:00";
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
      if (!value.is_string() || !IsUnicastMac(value.get<std::string>())) {
        return Bad("macAddress " + EscapeForDisplay(value.dump(), 80) +
                   " is not a unicast MAC address like \"02:00:00:aa:bb:cc\"");
      }
      std::string mac = value.get<std::string>();
      std::transform(mac.begin(), mac.end(), mac.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      config.mac_address = mac;
    } else {
      return Bad("unknown field \"" + EscapeForDisplay(key, 80) +
                 "\" (known: apiVersion, kind, iommuInterface, macAddress)");
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
  return config;
}

}  // namespace vfio_dra::prepare
