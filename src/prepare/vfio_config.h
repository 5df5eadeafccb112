// VfioConfig: the opaque device configuration vfio-dra accepts in DeviceClasses and claims
// (apiVersion "<driver>/v1alpha1", kind "VfioConfig"). Decoding is strict: an unknown field, kind
// or version is an error naming it, because a silently ignored setting is a VM that starts
// without what its owner asked for. Configs of other drivers are not ours to read; a config with
// no requests applies to every request; configs apply in the API's order (class configs, then the
// claim's), so a later setting overrides an earlier one.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "kube/resource_claim.h"

namespace vfio_dra::prepare {

enum class IommuInterface {
  kLegacy,   // /dev/vfio/vfio and the group node (what QEMU uses by default)
  kIommufd,  // /dev/iommu and the per-device cdevs; an error when the node has no iommufd
  kBoth,     // the legacy nodes, plus the iommufd nodes when the node has them
};

struct VfioConfig {
  IommuInterface iommu = IommuInterface::kLegacy;
  std::optional<std::string> mac_address;  // SR-IOV VFs: set through the PF before binding
};

inline constexpr const char* kVfioConfigVersion = "v1alpha1";
inline constexpr const char* kVfioConfigKind = "VfioConfig";

// Applies one config object's settings on top of `config`.
Status DecodeVfioConfig(const nlohmann::json& parameters, const std::string& driver,
                        VfioConfig& config);

// The effective config of one allocated request ("req" or "req/sub").
Result<VfioConfig> ConfigForRequest(const std::vector<kube::DeviceAllocationConfiguration>& configs,
                                    const std::string& driver, const std::string& request);

const char* IommuInterfaceName(IommuInterface iommu);

}  // namespace vfio_dra::prepare
