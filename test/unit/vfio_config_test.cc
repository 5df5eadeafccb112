// VfioConfig decoding: strict about versions, kinds, fields and values; scoped by driver and
// request; later configs override earlier ones.
#include "prepare/vfio_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vfio_dra::prepare {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kDriver = "vfio.dra.io";

json Config(const json& fields = json::object()) {
  json out = {{"apiVersion", "vfio.dra.io/v1alpha1"}, {"kind", "VfioConfig"}};
  out.update(fields);
  return out;
}

kube::DeviceAllocationConfiguration Entry(const json& parameters,
                                          std::vector<std::string> requests = {},
                                          const std::string& driver = kDriver) {
  kube::DeviceAllocationConfiguration entry;
  entry.source = "FromClaim";
  entry.requests = std::move(requests);
  entry.opaque = kube::OpaqueDeviceConfiguration{driver, parameters};
  return entry;
}

std::string DecodeError(const json& parameters) {
  VfioConfig config;
  Status s = DecodeVfioConfig(parameters, kDriver, config);
  return s.ok() ? "" : s.error().message;
}

TEST(VfioConfig, DefaultsToTheLegacyInterface) {
  auto config = ConfigForRequest({}, kDriver, "gpu");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->iommu, IommuInterface::kLegacy);
  EXPECT_TRUE(config->network.Empty());
}

TEST(VfioConfig, RefusesWhatItDoesNotKnowNamingIt) {
  EXPECT_THAT(DecodeError(Config({{"apiVersion", "vfio.dra.io/v1"}})),
              HasSubstr("apiVersion \"vfio.dra.io/v1\" is not supported"));
  EXPECT_THAT(DecodeError(Config({{"kind", "GpuConfig"}})),
              HasSubstr("kind \"GpuConfig\" is not supported"));
  EXPECT_THAT(DecodeError(json{{"kind", "VfioConfig"}}), HasSubstr("apiVersion is missing"));
  EXPECT_THAT(DecodeError(Config({{"iommuInterface", "vfio"}})),
              HasSubstr("iommuInterface \"vfio\" is not one of legacy, iommufd, both"));
  EXPECT_THAT(DecodeError(Config({{"iommuInterface", 1}})), HasSubstr("must be a string"));
  EXPECT_THAT(DecodeError(Config({{"macAddress", "01:00:5e:00:00:01"}})),
              HasSubstr("not a unicast MAC address"));
  EXPECT_THAT(DecodeError(Config({{"macAddress", "02:00:00:aa:bb"}})),
              HasSubstr("not a unicast MAC address"));
  EXPECT_THAT(DecodeError(Config({{"vlan", 4095}})), HasSubstr("vlan 4095 is not an integer"));
  EXPECT_THAT(DecodeError(Config({{"vlan", "42"}})), HasSubstr("vlan \"42\" is not an integer"));
  EXPECT_THAT(DecodeError(Config({{"qos", 8}})), HasSubstr("qos 8 is not an integer from 0 to 7"));
  EXPECT_THAT(DecodeError(Config({{"trust", "yes"}})), HasSubstr("trust \"yes\" is not true"));
  EXPECT_THAT(DecodeError(Config({{"spoofChk", 0}})), HasSubstr("spoofChk 0 is not true"));
  EXPECT_THAT(DecodeError(Config({{"vgaArbiter", true}})),
              HasSubstr("unknown field \"vgaArbiter\""));
  EXPECT_THAT(DecodeError(json::array()), HasSubstr("must be a JSON object"));
}

TEST(VfioConfig, AcceptsEveryDocumentedField) {
  VfioConfig config;
  ASSERT_TRUE(DecodeVfioConfig(Config({{"iommuInterface", "both"},
                                       {"macAddress", "02:AB:00:00:00:01"},
                                       {"vlan", 42},
                                       {"qos", 3},
                                       {"spoofChk", false},
                                       {"trust", true}}),
                               kDriver, config)
                  .ok());
  EXPECT_EQ(config.iommu, IommuInterface::kBoth);
  EXPECT_EQ(config.network.mac, "02:ab:00:00:00:01");
  EXPECT_EQ(config.network.vlan, 42);
  EXPECT_EQ(config.network.qos, 3);
  EXPECT_EQ(config.network.spoof_check, false);
  EXPECT_EQ(config.network.trust, true);
}

TEST(VfioConfig, NetworkSettingsMergeAcrossClassAndClaim) {
  // The class sets the VLAN and trust, the claim its MAC and QoS and turns trust off again.
  auto class_config = Entry(Config({{"vlan", 100}, {"trust", true}}));
  class_config.source = "FromClass";
  const std::vector<kube::DeviceAllocationConfiguration> configs = {
      class_config,
      Entry(Config({{"macAddress", "02:00:00:00:00:07"}, {"qos", 5}, {"trust", false}}), {"nic"})};
  auto nic = ConfigForRequest(configs, kDriver, "nic");
  ASSERT_TRUE(nic.ok()) << nic.error().message;
  EXPECT_EQ(nic->network.Display(), "mac 02:00:00:00:00:07, vlan 100 qos 5, trust off");
  auto other = ConfigForRequest(configs, kDriver, "other");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->network.Display(), "vlan 100, trust on");
}

TEST(VfioConfig, QosWithoutVlanIsRefusedOnceEveryConfigApplied) {
  auto config = ConfigForRequest({Entry(Config({{"qos", 3}}))}, kDriver, "nic");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.error().message, HasSubstr("qos 3 needs a vlan"));
  EXPECT_THAT(config.error().message, HasSubstr("request nic"));
}

TEST(VfioConfig, AppliesByDriverAndRequestLaterOverridingEarlier) {
  const std::vector<kube::DeviceAllocationConfiguration> configs = {
      Entry(Config({{"iommuInterface", "both"}})),                    // every request
      Entry(Config({{"iommuInterface", "iommufd"}}), {"nic"}),        // only "nic"
      Entry(json{{"anything", "goes"}}, {}, "gpu.other.io"),          // not ours
      Entry(Config({{"iommuInterface", "legacy"}}), {"gpu/large"})};  // a subrequest
  auto gpu = ConfigForRequest(configs, kDriver, "gpu");
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  EXPECT_EQ(gpu->iommu, IommuInterface::kBoth);
  auto nic = ConfigForRequest(configs, kDriver, "nic");
  ASSERT_TRUE(nic.ok());
  EXPECT_EQ(nic->iommu, IommuInterface::kIommufd);
  auto sub = ConfigForRequest(configs, kDriver, "gpu/large");
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(sub->iommu, IommuInterface::kLegacy);
}

TEST(VfioConfig, AnErrorNamesTheConfigEntry) {
  auto config = ConfigForRequest({Entry(Config()), Entry(Config({{"typo", 1}}))}, kDriver, "gpu");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.error().message, HasSubstr("status.allocation.config[1] (FromClaim)"));
}

}  // namespace
}  // namespace vfio_dra::prepare
