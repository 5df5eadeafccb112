#include "kube/resource_claim.h"

#include <gtest/gtest.h>

namespace vfio_dra::kube {
namespace {

TEST(ResourceClaim, ParsesAllocationResultsAndConfig) {
  auto json = nlohmann::json::parse(R"({
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"namespace": "vms", "name": "gpu-claim", "uid": "u-1", "resourceVersion": "7",
                 "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
    "status": {"allocation": {"devices": {
      "results": [
        {"request": "gpu/big", "driver": "vfio.dra.io", "pool": "node1", "device": "gpu-0000-3b-00-0"},
        {"request": "nic", "driver": "other.example.com", "pool": "p", "device": "d",
         "shareID": "3f1c", "adminAccess": true}],
      "config": [{"source": "FromClaim", "requests": ["gpu"],
                  "opaque": {"driver": "vfio.dra.io", "parameters": {"kind": "VfioConfig"}}}]}}}
  })");
  auto claim = ParseResourceClaim(json);
  ASSERT_TRUE(claim.ok()) << claim.error().message;
  EXPECT_EQ(claim->namespace_, "vms");
  EXPECT_EQ(claim->uid, "u-1");
  EXPECT_EQ(claim->annotations.at("resource.kubernetes.io/pod-claim-name"), "gpu");
  ASSERT_TRUE(claim->allocation.has_value());
  ASSERT_EQ(claim->allocation->results.size(), 2u);
  EXPECT_EQ(claim->allocation->results[0].request, "gpu/big");
  EXPECT_EQ(claim->allocation->results[1].share_id.value(), "3f1c");
  EXPECT_TRUE(claim->allocation->results[1].admin_access);
  ASSERT_EQ(claim->allocation->config.size(), 1u);
  EXPECT_EQ(claim->allocation->config[0].opaque->driver, "vfio.dra.io");
  EXPECT_EQ(claim->allocation->config[0].opaque->parameters["kind"], "VfioConfig");
}

TEST(ResourceClaim, UnallocatedClaimHasNoAllocation) {
  auto claim = ParseResourceClaim(
      nlohmann::json::parse(R"({"metadata":{"namespace":"a","name":"b","uid":"c"},"status":{}})"));
  ASSERT_TRUE(claim.ok());
  EXPECT_FALSE(claim->allocation.has_value());
}

TEST(ResourceClaim, WrongTypesAreErrorsNamingTheField) {
  auto bad = ParseResourceClaim(nlohmann::json::parse(
      R"({"metadata":{"name":"b"},"status":{"allocation":{"devices":{"results":[{"request":"r","driver":5}]}}}})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("status.allocation.devices.results[0].driver"),
            std::string::npos)
      << bad.error().message;
  auto missing = ParseResourceClaim(nlohmann::json::parse(
      R"({"metadata":{"name":"b"},"status":{"allocation":{"devices":{"results":[{"request":"r","driver":"d","pool":"p"}]}}}})"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("results[0].device is required"), std::string::npos);
  EXPECT_FALSE(ParseResourceClaim(nlohmann::json::array()).ok());
  EXPECT_FALSE(
      ParseResourceClaim(nlohmann::json::parse(R"({"metadata":{"annotations":{"a":1}}})")).ok());
}

TEST(ResourceClaim, ParsesReservedFor) {
  auto claim = ParseResourceClaim(nlohmann::json::parse(R"({
    "metadata": {"namespace": "vms", "name": "c", "uid": "u"},
    "status": {"reservedFor": [
      {"resource": "pods", "name": "virt-launcher-vm1-x7k2p", "uid": "pod-uid-1"},
      {"apiGroup": "", "resource": "pods", "name": "p2", "uid": "pod-uid-2"},
      {"apiGroup": "batch.example.com", "resource": "jobs", "name": "j", "uid": "job-uid"}]}
  })"));
  ASSERT_TRUE(claim.ok()) << claim.error().message;
  EXPECT_FALSE(claim->allocation.has_value());
  ASSERT_EQ(claim->reserved_for.size(), 3u);
  EXPECT_EQ(claim->reserved_for[0].name, "virt-launcher-vm1-x7k2p");
  EXPECT_EQ(claim->reserved_for[0].uid, "pod-uid-1");
  EXPECT_TRUE(claim->reserved_for[0].IsPod());
  EXPECT_TRUE(claim->reserved_for[1].IsPod());
  EXPECT_EQ(claim->reserved_for[2].api_group, "batch.example.com");
  EXPECT_FALSE(claim->reserved_for[2].IsPod());

  auto unreserved = ParseResourceClaim(
      nlohmann::json::parse(R"({"metadata": {"name": "c"}, "status": {"reservedFor": null}})"));
  ASSERT_TRUE(unreserved.ok());
  EXPECT_TRUE(unreserved->reserved_for.empty());
}

// status.devices is read for the conditions' lastTransitionTime; what is not well-formed there is
// left out (it may be another driver's) instead of failing the claim.
TEST(ResourceClaim, ReadsTheDeviceStatusesItCanAndSkipsTheRest) {
  auto claim = ParseResourceClaim(nlohmann::json::parse(R"({
    "metadata": {"namespace": "vms", "name": "c", "uid": "u"},
    "status": {"devices": [
      {"driver": "vfio.dra.io", "pool": "node1", "device": "vf-0000-5e-02-1",
       "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                       "lastTransitionTime": "2026-11-25T10:00:00Z"}, 7]},
      {"driver": "other.example.com", "pool": 3, "device": "d"},
      "junk"]}
  })"));
  ASSERT_TRUE(claim.ok()) << claim.error().message;
  ASSERT_EQ(claim->device_statuses.size(), 1u);
  const AllocatedDeviceStatus& device = claim->device_statuses[0];
  EXPECT_EQ(device.device, "vf-0000-5e-02-1");
  ASSERT_EQ(device.conditions.size(), 1u);
  EXPECT_EQ(device.conditions[0].status, "True");
  EXPECT_EQ(device.conditions[0].last_transition_time, "2026-11-25T10:00:00Z");
}

TEST(ResourceClaim, MalformedReservedForIsAnErrorNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"reservedFor": {"name": "p"}})", "status.reservedFor must be a list"},
      {R"({"reservedFor": ["p"]})", "status.reservedFor[0] must be an object"},
      {R"({"reservedFor": [{"resource": "pods", "name": "p", "uid": 5}]})",
       "status.reservedFor[0].uid must be a string"},
      {R"({"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"},
                           {"apiGroup": 1, "resource": "pods", "name": "q", "uid": "v"}]})",
       "status.reservedFor[1].apiGroup must be a string"},
      {R"({"reservedFor": [{"resource": "pods", "uid": "u"}]})",
       "status.reservedFor[0].name is required"},
      {R"({"reservedFor": [{"name": "p", "uid": "u"}]})",
       "status.reservedFor[0].resource is required"},
  };
  for (const auto& [status, expected] : cases) {
    auto json = nlohmann::json::parse(R"({"metadata": {"name": "c"}})");
    json["status"] = nlohmann::json::parse(status);
    auto claim = ParseResourceClaim(json);
    ASSERT_FALSE(claim.ok()) << status;
    EXPECT_EQ(claim.error().kind, ErrorKind::kInvalidArgument);
    EXPECT_NE(claim.error().message.find(expected), std::string::npos) << claim.error().message;
  }
}

TEST(ResourceClaim, BaseRequestNameStripsSubrequest) {
  EXPECT_EQ(BaseRequestName("gpu/large"), "gpu");
  EXPECT_EQ(BaseRequestName("gpu"), "gpu");
}

}  // namespace
}  // namespace vfio_dra::kube
