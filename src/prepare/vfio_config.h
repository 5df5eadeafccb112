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
#include "vfio/vf_network.h"

namespace vfio_dra::prepare {

enum class IommuInterface {
  kLegacy,   // /dev/vfio/vfio and the group node (what QEMU uses by default)
  kIommufd,  // /dev/iommu and the per-device cdevs; an error when the node has no iommufd
  kBoth,     // the legacy nodes, plus the iommufd nodes when the node has them
};

struct VfioConfig {
  IommuInterface iommu = IommuInterface::kLegacy;
  // SR-IOV VFs of network PFs (macAddress, vlan, qos, spoofChk, trust): set through the PF before
  // binding and restored after. KubeVirt's per-interface MAC (the pod annotation) overrides mac.
  vfio::VfNetSettings network;
};

inline constexpr const char* kVfioConfigVersion = "v1alpha1";
inline constexpr const char* kVfioConfigKind = "VfioConfig";

// Applies one config object's settings on top of `config`.
Status DecodeVfioConfig(const nlohmann::json& parameters, const std::string& driver,
                        VfioConfig& config);

// The effective config of one allocated request ("req" or "req/sub"). A qos without a VLAN is an
// error here, once every config has applied (a class may set the VLAN and a claim the QoS).
Result<VfioConfig> ConfigForRequest(const std::vector<kube::DeviceAllocationConfiguration>& configs,
                                    const std::string& driver, const std::string& request);

const char* IommuInterfaceName(IommuInterface iommu);

// A unicast, non-zero MAC in lower case; nullopt otherwise.
std::optional<std::string> UnicastMac(const std::string& text);

}  // namespace vfio_dra::prepare
