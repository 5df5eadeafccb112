// ResourceClaim: the parts of a resource.k8s.io ResourceClaim that a node plugin acts on, parsed
// from any served version (v1, v1beta2 and v1beta1 share the status shape). Parsing is strict
// about types: a field of the wrong type is an error naming the field, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace vfio_dra::kube {

struct DeviceRequestAllocationResult {
  std::string request;  // "req" or "req/subreq"
  std::string driver;
  std::string pool;
  std::string device;
  std::optional<std::string> share_id;
  bool admin_access = false;
};

struct OpaqueDeviceConfiguration {
  std::string driver;
  nlohmann::json parameters;  // an arbitrary JSON object, decoded by the driver
};

struct DeviceAllocationConfiguration {
  std::string source;                 // FromClass | FromClaim
  std::vector<std::string> requests;  // empty: applies to all requests
  std::optional<OpaqueDeviceConfiguration> opaque;
};

struct AllocationResult {
  std::vector<DeviceRequestAllocationResult> results;
  std::vector<DeviceAllocationConfiguration> config;
};

// metav1.Condition.
struct DeviceCondition {
  std::string type;    // e.g. "Ready"
  std::string status;  // "True" | "False" | "Unknown"
  std::string reason;  // CamelCase
  std::string message;
  int64_t observed_generation = 0;   // the claim's metadata.generation
  std::string last_transition_time;  // RFC 3339; the writer fills it in when empty
};

// resource.k8s.io NetworkDeviceData.
struct NetworkDeviceData {
  std::string interface_name;
  std::vector<std::string> ips;  // CIDRs
  std::string hardware_address;
};

// resource.k8s.io AllocatedDeviceStatus: what drivers report about allocated devices
// (status.devices[]).
struct AllocatedDeviceStatus {
  std::string driver;
  std::string pool;
  std::string device;
  std::optional<std::string> share_id;
  std::vector<DeviceCondition> conditions;
  std::optional<nlohmann::json> data;  // a JSON object
  std::optional<NetworkDeviceData> network_data;
};

// status.reservedFor[]: who uses the claim (the kubelet prepares it for pods among them).
struct ResourceClaimConsumerReference {
  std::string api_group;  // "" for core
  std::string resource;   // e.g. "pods"
  std::string name;
  std::string uid;
  bool IsPod() const { return api_group.empty() && resource == "pods"; }
};

struct ResourceClaim {
  std::string api_version;
  std::string namespace_;
  std::string name;
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  std::map<std::string, std::string> annotations;
  std::optional<AllocationResult> allocation;
  std::vector<ResourceClaimConsumerReference> reserved_for;
  // status.devices[], as far as it is well-formed (the writer's lastTransitionTime stays when a
  // condition's status does not change). An entry that is not is left out rather than failing
  // the claim: it is information, and may be another driver's.
  std::vector<AllocatedDeviceStatus> device_statuses;
};

Result<ResourceClaim> ParseResourceClaim(const nlohmann::json& object);
// A status.devices list: the well-formed entries (driver, pool and device set), with all their
// fields; malformed entries are left out.
std::vector<AllocatedDeviceStatus> ParseDeviceStatuses(const nlohmann::json& devices);

// The annotation the ResourceClaim controller puts on a claim generated from a pod's template:
// the pod's name for the claim (spec.resourceClaims[].name).
inline constexpr const char* kPodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name";

// "req/subreq" -> "req": container specs and the kubelet only know top-level request names.
std::string BaseRequestName(const std::string& request);

}  // namespace vfio_dra::kube
