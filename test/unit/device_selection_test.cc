#include "discovery/device_selection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "discovery/node_scan.h"
#include "unit/fixture_node.h"

namespace vfio_dra::discovery {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using vfio_dra::testing::FixtureNode;
using vfio_dra::testing::MakePciSpec;
using vfio_dra::testing::PciSpec;
using vfio_dra::testing::SysfsFixture;

AdminPolicy Policy(const std::string& yaml) {
  auto policy = ParseAdminPolicy(yaml, "test-policy.yaml");
  EXPECT_TRUE(policy.ok()) << policy.error().message;
  return *policy;
}

const SelectedDevice* Published(const DeviceSelection& s, const std::string& address) {
  for (const auto& d : s.devices) {
    if (d.address == address) return &d;
  }
  return nullptr;
}

TEST(DeviceSelection, GpusTakeTheirCompanionFunctionsAlong) {
  FixtureNode node("workstation");
  const DeviceSelection s = SelectDevices(node.Scan(), AdminPolicy{});
  ASSERT_EQ(s.devices.size(), 2u);
  const SelectedDevice* a6000 = Published(s, "0000:01:00.0");
  ASSERT_NE(a6000, nullptr);
  EXPECT_EQ(a6000->kind, DeviceKind::kGpu);
  EXPECT_THAT(a6000->companions, ElementsAre("0000:01:00.1"));
  const SelectedDevice* turing = Published(s, "0000:02:00.0");
  ASSERT_NE(turing, nullptr);
  EXPECT_THAT(turing->companions, ElementsAre("0000:02:00.1", "0000:02:00.2", "0000:02:00.3"));
  EXPECT_FALSE(s.functions.at("0000:02:00.2").published);
  EXPECT_THAT(s.functions.at("0000:02:00.2").reason, HasSubstr("companion of GPU 0000:02:00.0"));
}

TEST(DeviceSelection, AHostUsedFunctionInTheGroupBlocksTheCandidate) {
  FixtureNode node("sriov");
  // The admin selects the second X710 port, but it shares group 70 with the node's own NIC.
  const DeviceSelection s =
      SelectDevices(node.Scan(), Policy("select:\n  - kind: hostdev\n    address: 0000:70:00.1\n"));
  EXPECT_EQ(Published(s, "0000:70:00.1"), nullptr);
  EXPECT_THAT(s.functions.at("0000:70:00.1").reason,
              HasSubstr("IOMMU group 70 also holds 0000:70:00.0"));
  EXPECT_THAT(s.functions.at("0000:70:00.1").reason, HasSubstr("driver igc"));
  EXPECT_THAT(s.functions.at("0000:70:00.1").reason, HasSubstr("the host uses"));
}

TEST(DeviceSelection, SelectingTheWholeGroupMakesItOneDevice) {
  FixtureNode node("sriov");
  const DeviceSelection s = SelectDevices(
      node.Scan(),
      Policy("select:\n  - kind: hostdev\n    address: [0000:70:00.0, 0000:70:00.1]\n"));
  const SelectedDevice* device = Published(s, "0000:70:00.0");
  ASSERT_NE(device, nullptr);
  EXPECT_THAT(device->companions, ElementsAre("0000:70:00.1"));
  EXPECT_THAT(s.functions.at("0000:70:00.1").reason,
              HasSubstr("shares IOMMU group 70 with 0000:70:00.0"));
}

TEST(DeviceSelection, PfsWithVfsAndBridgesAreNeverManaged) {
  FixtureNode node("sriov");
  const DeviceSelection s =
      SelectDevices(node.Scan(), Policy("select:\n  - kind: hostdev\n    vendor: \"8086\"\n"));
  EXPECT_EQ(Published(s, "0000:5e:00.0"), nullptr);
  EXPECT_THAT(s.functions.at("0000:5e:00.0").reason, HasSubstr("SR-IOV PF with 8 VFs enabled"));
  EXPECT_EQ(Published(s, "0000:5d:00.0"), nullptr);
  EXPECT_EQ(s.functions.at("0000:5d:00.0").reason, "bridge: never managed");
  // The PF without VFs enabled is an ordinary host device once selected.
  EXPECT_NE(Published(s, "0000:5e:00.1"), nullptr);
}

TEST(DeviceSelection, DevicesWithoutIommuGroupOnlyWithTheUnsafeSwitch) {
  FixtureNode node("iommu-off");
  const DeviceSelection safe = SelectDevices(node.Scan(), AdminPolicy{});
  EXPECT_TRUE(safe.devices.empty());
  EXPECT_THAT(safe.functions.at("0000:00:02.0").reason,
              HasSubstr("no IOMMU group: the IOMMU is off"));
  const DeviceSelection unsafe = SelectDevices(node.Scan(), Policy("unsafeNoIommu: true\n"));
  const SelectedDevice* gpu = Published(unsafe, "0000:00:02.0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_TRUE(gpu->unsafe_no_iommu);
  EXPECT_THAT(unsafe.functions.at("0000:00:02.0").reason, HasSubstr("UNSAFE"));
}

TEST(DeviceSelection, DefaultPolicyPublishesKnownNicVfsOnly) {
  FixtureNode node("sriov");
  SysfsFixture fx(node.sysfs_root());
  // An NVMe PF (QEMU vendor) with one VF in its own group: not a known NIC, so the VF needs a
  // selector.
  PciSpec nvme = MakePciSpec("0000:09:00.0", 0x1b36, 0x0010, 0x010802, "nvme", 89);
  fx.AddPci(nvme);
  PciSpec vf = nvme;
  vf.driver = "";
  vf.iommu_group = 90;
  fx.MakeSriovPf("0000:09:00.0", 4, 0x0010, {vf}, /*offset=*/1);
  const Inventory inv = node.Scan();
  EXPECT_TRUE(inv.warnings.empty());
  const DeviceSelection s = SelectDevices(inv, AdminPolicy{});
  EXPECT_EQ(s.devices.size(), 8u);
  EXPECT_THAT(s.functions.at("0000:09:00.1").reason, HasSubstr("not a known NIC VF"));
  const DeviceSelection with_selector =
      SelectDevices(inv, Policy("select:\n  - kind: vf\n    vendor: \"1b36\"\n"));
  EXPECT_NE(Published(with_selector, "0000:09:00.1"), nullptr);
  // With a vf selector, only what it matches is published.
  EXPECT_EQ(Published(with_selector, "0000:5e:02.0"), nullptr);
}

TEST(DeviceSelection, HostDevicesNeedASelectorAndDenyWins) {
  FixtureNode node("workstation");
  const Inventory inv = node.Scan();
  const DeviceSelection none = SelectDevices(inv, AdminPolicy{});
  EXPECT_THAT(none.functions.at("0000:04:00.0").reason, HasSubstr("hostdev selector"));
  const DeviceSelection s = SelectDevices(inv, Policy(R"(select:
  - kind: hostdev
    class: "0108"
deny:
  - address: 0000:01:00.0
)"));
  EXPECT_NE(Published(s, "0000:04:00.0"), nullptr);
  EXPECT_EQ(Published(s, "0000:01:00.0"), nullptr);
  EXPECT_EQ(s.functions.at("0000:01:00.0").reason, "denied by the policy (deny[0])");
  // The denied GPU's audio function is now an unmanaged... and stays unpublished.
  EXPECT_FALSE(s.functions.at("0000:01:00.1").published);
}

TEST(DeviceSelection, KindsCanBeTurnedOff) {
  FixtureNode node("workstation");
  const DeviceSelection s = SelectDevices(node.Scan(), Policy("kinds: {gpu: false}\n"));
  EXPECT_TRUE(s.devices.empty());
  EXPECT_THAT(s.functions.at("0000:01:00.0").reason,
              HasSubstr("kind gpu is turned off by the policy (test-policy.yaml)"));
}

TEST(DeviceSelection, OtherDisplayControllersAreGpusOnlyWhenSelected) {
  FixtureNode node("");
  SysfsFixture fx(node.sysfs_root());
  PciSpec other = MakePciSpec("0000:05:00.0", 0x1002, 0x7408, 0x038000, "amdgpu", 5);
  fx.AddPci(other);
  const Inventory inv = node.Scan();
  EXPECT_EQ(SelectDevices(inv, AdminPolicy{}).functions.at("0000:05:00.0").kind,
            DeviceKind::kHostdev);
  const DeviceSelection s =
      SelectDevices(inv, Policy("select:\n  - kind: gpu\n    class: \"0380\"\n"));
  const SelectedDevice* gpu = Published(s, "0000:05:00.0");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->kind, DeviceKind::kGpu);
}

TEST(DeviceSelection, AnUnmanagedVfioPciFunctionBlocksItsGroup) {
  FixtureNode node("");
  SysfsFixture fx(node.sysfs_root());
  PciSpec gpu = MakePciSpec("0000:06:00.0", 0x10de, 0x2230, 0x030000, "", 6);
  fx.AddPci(gpu);
  PciSpec other = gpu;
  other.address = "0000:06:01.0";
  other.class_code = 0x020000;
  other.vendor = 0x8086;
  other.device = 0x1572;
  other.driver = "vfio-pci";
  fx.AddPci(other);
  const DeviceSelection s = SelectDevices(node.Scan(), AdminPolicy{});
  EXPECT_TRUE(s.devices.empty());
  EXPECT_THAT(s.functions.at("0000:06:00.0").reason,
              HasSubstr("is bound to vfio-pci outside vfio-dra"));
}

TEST(DeviceSelection, UnboundFunctionsInTheGroupDoNotBlock) {
  FixtureNode node("");
  SysfsFixture fx(node.sysfs_root());
  PciSpec gpu = MakePciSpec("0000:06:00.0", 0x10de, 0x2230, 0x030000, "nvidia", 6);
  fx.AddPci(gpu);
  PciSpec idle = gpu;
  idle.address = "0000:06:01.0";
  idle.class_code = 0x088000;
  idle.driver = "";
  fx.AddPci(idle);
  const DeviceSelection s = SelectDevices(node.Scan(), AdminPolicy{});
  const SelectedDevice* published = Published(s, "0000:06:00.0");
  ASSERT_NE(published, nullptr);
  EXPECT_TRUE(published->companions.empty());
}

TEST(DeviceSelection, MdevTypesFollowPolicyAndDeviceApi) {
  FixtureNode node("vgpu");
  const Inventory inv = node.Scan();
  const DeviceSelection all = SelectDevices(inv, AdminPolicy{});
  EXPECT_EQ(all.mdev_types.size(), 4u);
  // The T4 itself is also a whole-device GPU (counters keep the two apart in the slices).
  EXPECT_NE(Published(all, "0000:3b:00.0"), nullptr);
  const DeviceSelection some = SelectDevices(
      inv, Policy("select:\n  - kind: mdev\n    mdevType: [nvidia-222, nvidia-223]\ndeny:\n"
                  "  - mdevType: nvidia-222\n"));
  ASSERT_EQ(some.mdev_types.size(), 1u);
  EXPECT_EQ(some.mdev_types[0].type_id, "nvidia-223");
  for (const auto& d : some.mdev_decisions) {
    if (d.type_id == "nvidia-222") {
      EXPECT_EQ(d.reason, "denied by the policy (deny[0])");
    }
    if (d.type_id == "nvidia-228") {
      EXPECT_EQ(d.reason, "no mdev selector of the policy matches");
    }
  }
  FixtureNode ccw("");
  SysfsFixture fx(ccw.sysfs_root());
  fx.AddVirtualMdevParent("css", {{"vfio_ccw-io", "I/O subchannel", "", 1, "vfio-ccw"}});
  const DeviceSelection s = SelectDevices(ccw.Scan(), AdminPolicy{});
  EXPECT_TRUE(s.mdev_types.empty());
  ASSERT_EQ(s.mdev_decisions.size(), 1u);
  EXPECT_EQ(s.mdev_decisions[0].reason, "device_api is vfio-ccw, not vfio-pci");
}

}  // namespace
}  // namespace vfio_dra::discovery

namespace vfio_dra::discovery {
namespace {

TEST(DeviceSelection, AnUnreadableFunctionInTheGroupCountsAsInUse) {
  FixtureNode node("workstation");
  // The GPU's audio function loses its modalias: nothing is known about it but its group.
  std::filesystem::remove(node.sysfs_root() +
                          "/devices/pci0000:00/0000:00:01.0/0000:01:00.1/modalias");
  const Inventory inv = node.Scan();
  EXPECT_EQ(inv.Find("0000:01:00.1"), nullptr);
  EXPECT_THAT(inv.iommu_groups.at(10).unreadable_members, ElementsAre("0000:01:00.1"));
  const DeviceSelection s = SelectDevices(inv, AdminPolicy{});
  EXPECT_EQ(Published(s, "0000:01:00.0"), nullptr);
  EXPECT_THAT(s.functions.at("0000:01:00.0").reason,
              HasSubstr("IOMMU group 10 also holds 0000:01:00.1, whose sysfs entry could not be "
                        "read"));
}

}  // namespace
}  // namespace vfio_dra::discovery

namespace vfio_dra::discovery {
namespace {

TEST(DeviceSelection, DevicesBehindVmdAreNeverManaged) {
  FixtureNode node("vmd");
  const DeviceSelection s =
      SelectDevices(node.Scan(), Policy("select:\n  - kind: hostdev\n    class: \"0108\"\n"));
  EXPECT_EQ(Published(s, "10000:01:00.0"), nullptr);
  EXPECT_THAT(s.functions.at("10000:01:00.0").reason,
              HasSubstr("behind a VMD controller (PCI domain 10000)"));
  EXPECT_NE(Published(s, "0000:65:00.0"), nullptr);
}

// While vfio-dra holds a prepared function on vfio-pci, the policy and the safety rules judge it by
// the driver it had before: a `driver:` selector keeps matching (the device stays published, so
// the kubelet's retry of the completed claim finds it) and a driverless group member bound along
// with it does not block its own group.
TEST(ManagedFunctions, AreJudgedByTheDriverTheyHadBefore) {
  testing::FixtureNode node("");
  testing::SysfsFixture fx(node.sysfs_root());
  fx.AddPci(testing::MakePciSpec("0000:06:00.0", 0x144d, 0xa808, 0x010802, "vfio-pci", 60));
  fx.AddPci(testing::MakePciSpec("0000:06:00.1", 0x144d, 0xa809, 0x088000, "vfio-pci", 60));
  auto policy = ParseAdminPolicy(R"(version: v1
select:
  - kind: hostdev
    driver: nvme
)",
                                 "policy.yaml");
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  sysfs::SysfsReader sysfs(node.sysfs_root());
  const auto unaware = ScanNode(sysfs, nullptr, *policy);
  EXPECT_FALSE(unaware->selection.functions.at("0000:06:00.0").published)
      << "on vfio-pci, the function no longer matches `driver: nvme`";

  ScanContext context;
  context.managed = {{"0000:06:00.0", {"nvme"}}, {"0000:06:00.1", {""}}};
  const auto scan = ScanNode(sysfs, nullptr, *policy, context);
  const auto& decision = scan->selection.functions.at("0000:06:00.0");
  EXPECT_TRUE(decision.published) << decision.reason;
  EXPECT_EQ(scan->inventory.functions.at("0000:06:00.0").driver, "nvme");
  EXPECT_TRUE(scan->inventory.functions.at("0000:06:00.0").bound_by_vfio_dra);
  EXPECT_EQ(scan->selection.devices.size(), 1u);
}

}  // namespace
}  // namespace vfio_dra::discovery
