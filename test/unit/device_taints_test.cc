// Device taints from the node's state (slicepublisher/device_taints.h), on the vm-host fixture: a
// GPU 0000:01:00.0 with its audio companion 0000:01:00.1 (group 10) and an X710 PF 0000:5e:00.0
// (netdev ens1f0) with four VFs.
#include "slicepublisher/device_taints.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "slicepublisher/device_attributes.h"
#include "slicepublisher/packed_device_table.h"
#include "slicepublisher/publishable_pool.h"
#include "slicepublisher/slice_builder.h"
#include "slicepublisher/slice_json.h"
#include "slicepublisher/slice_validator.h"
#include "sysfs_fixture.h"
#include "unit/fixture_node.h"

namespace vfio_dra::slicepublisher {
namespace {

using ::testing::HasSubstr;
using vfio_dra::testing::FixtureNode;

constexpr char kGpu[] = "gpu-0000-01-00-0";
constexpr char kDriver[] = "vfio.dra.io";

class DeviceTaintsTest : public ::testing::Test {
 protected:
  DesiredPool Build(const std::string& now, const PackedDeviceTable* published = nullptr,
                    std::set<std::string> held = {}, int minor = 37) {
    sysfs::SysfsReader sysfs(node_.sysfs_root());
    scan_ = discovery::ScanNode(sysfs, nullptr, {}, context_);
    TaintInputs taints;
    taints.driver = kDriver;
    taints.now = now;
    taints.published = published;
    taints.held = std::move(held);
    taints.recorded = recorded_;
    ServerProfile profile;
    profile.kubernetes_minor = minor;
    const discovery::NodeScan kept = BuilderInput(*scan_);
    PublishablePool built = BuildPublishablePool(kept, {"node-1", kDriver, profile}, {}, &taints);
    EXPECT_TRUE(built.valid.ok()) << built.valid.error().message;
    return built.pool;
  }
  void Write(const std::string& relative, const std::string& content) {
    testing::SysfsFixture(node_.sysfs_root()).WriteFile(relative, content);
  }
  static const SliceDevice* Find(const DesiredPool& pool, const std::string& name) {
    for (const SliceContent& slice : pool.slices) {
      for (const SliceDevice& device : slice.devices) {
        if (device.name == name) return &device;
      }
    }
    return nullptr;
  }
  static PackedDeviceTable Table(const DesiredPool& pool) {
    std::vector<const SliceDevice*> all;
    for (const SliceContent& slice : pool.slices) {
      for (const SliceDevice& device : slice.devices) all.push_back(&device);
    }
    return PackedDeviceTable(all);
  }
  static std::string Vf(const std::string& address) {
    return "vf-" + address.substr(0, 4) + "-" + address.substr(5, 2) + "-" + address.substr(8, 2) +
           "-" + address.substr(11, 1);
  }

  void BindTo(const std::string& address, const std::string& driver) {
    const std::string link = node_.sysfs_root() + "/bus/pci/devices/" + address + "/driver";
    std::filesystem::remove(link);
    std::filesystem::create_symlink("../../../../bus/pci/drivers/" + driver, link);
  }

  FixtureNode node_{"vm-host"};
  discovery::ScanContext context_;
  std::map<std::string, RecordedAttributes> recorded_;  // what the checkpoint records
  std::shared_ptr<const discovery::NodeScan> scan_;
};

const std::string kAerClean = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nTOTAL_ERR_FATAL 0\n";
const std::string kAerFatal = "Undefined 0\nDLP 1\nSDES 0\nTLP 0\nTOTAL_ERR_FATAL 1\n";

TEST_F(DeviceTaintsTest, FatalAerErrorsOnACompanionTaintTheGpuNoScheduleUntilTheCountIsZero) {
  Write("bus/pci/devices/0000:01:00.0/aer_dev_fatal", kAerClean);
  Write("bus/pci/devices/0000:01:00.1/aer_dev_fatal", kAerClean);
  DesiredPool pool = Build("2026-11-28T01:00:00Z");
  ASSERT_NE(Find(pool, kGpu), nullptr);
  EXPECT_TRUE(Find(pool, kGpu)->taints.empty());
  EXPECT_TRUE(pool.taint_reasons.empty());

  Write("bus/pci/devices/0000:01:00.1/aer_dev_fatal", kAerFatal);
  pool = Build("2026-11-28T01:00:05Z");
  ASSERT_EQ(Find(pool, kGpu)->taints.size(), 1u);
  EXPECT_EQ(Find(pool, kGpu)->taints[0], (DeviceTaint{"vfio.dra.io/unhealthy", "aer-fatal",
                                                      kEffectNoSchedule, "2026-11-28T01:00:05Z"}));
  EXPECT_THAT(pool.taint_reasons.at(kGpu), HasSubstr("0000:01:00.1 has counted 1 fatal"));

  Write("bus/pci/devices/0000:01:00.1/aer_dev_fatal", kAerClean);
  pool = Build("2026-11-28T01:00:10Z");
  EXPECT_TRUE(Find(pool, kGpu)->taints.empty());
}

TEST_F(DeviceTaintsTest, ATaintThatStaysKeepsTheTimeItWasFirstPublished) {
  Write("bus/pci/devices/0000:01:00.0/aer_dev_fatal", kAerFatal);
  const DesiredPool first = Build("2026-11-28T01:00:00Z");
  const PackedDeviceTable published = Table(first);
  const DesiredPool again = Build("2026-11-28T02:00:00Z", &published);
  EXPECT_EQ(Find(again, kGpu)->taints[0].time_added, "2026-11-28T01:00:00Z");
  EXPECT_EQ(again.slices, first.slices) << "an unchanged node rewrites nothing";
}

TEST_F(DeviceTaintsTest, APfWithItsLinkDownDegradesItsVfsWithEffectNoneFrom135Only) {
  Write("bus/pci/devices/0000:5e:00.0/net/ens1f0/operstate", "up\n");
  DesiredPool pool = Build("2026-11-28T01:00:00Z");
  const std::string vf = Vf(scan_->inventory.Find("0000:5e:00.0")->sriov_pf->vfs.at(0));
  ASSERT_NE(Find(pool, vf), nullptr) << vf;
  EXPECT_TRUE(Find(pool, vf)->taints.empty());

  Write("bus/pci/devices/0000:5e:00.0/net/ens1f0/operstate", "down\n");
  pool = Build("2026-11-28T01:00:00Z");
  ASSERT_EQ(Find(pool, vf)->taints.size(), 1u);
  EXPECT_EQ(Find(pool, vf)->taints[0].key, "vfio.dra.io/degraded");
  EXPECT_EQ(Find(pool, vf)->taints[0].value, "pf-link-down");
  EXPECT_EQ(Find(pool, vf)->taints[0].effect, kEffectNone);
  EXPECT_THAT(pool.taint_reasons.at(vf), HasSubstr("link of PF 0000:5e:00.0 (ens1f0) is down"));

  // 1.34 rejects effect None: such a taint is left out rather than the slice refused.
  pool = Build("2026-11-28T01:00:00Z", nullptr, {}, 34);
  EXPECT_TRUE(Find(pool, vf)->taints.empty());
}

TEST_F(DeviceTaintsTest, UnreadableAerCountersMarkTheDeviceUnmonitored) {
  Write("bus/pci/devices/0000:01:00.0/aer_dev_fatal", "garbage\n");
  const DesiredPool pool = Build("2026-11-28T01:00:00Z");
  ASSERT_EQ(Find(pool, kGpu)->taints.size(), 1u);
  EXPECT_EQ(Find(pool, kGpu)->taints[0].key, "vfio.dra.io/unmonitored");
  EXPECT_EQ(Find(pool, kGpu)->taints[0].effect, kEffectNone);
  EXPECT_THAT(pool.taint_reasons.at(kGpu), HasSubstr("no TOTAL_ERR_FATAL line"));
}

TEST_F(DeviceTaintsTest, AGoneVfStaysTaintedOnlyWhileAClaimHoldsIt) {
  const DesiredPool before = Build("2026-11-28T01:00:00Z");
  const std::string address = scan_->inventory.Find("0000:5e:00.0")->sriov_pf->vfs.at(1);
  const std::string vf = Vf(address);
  ASSERT_NE(Find(before, vf), nullptr);
  const PackedDeviceTable published = Table(before);
  std::filesystem::remove_all(node_.sysfs_root() + "/bus/pci/devices/" + address);

  DesiredPool held = Build("2026-11-28T01:00:07Z", &published, {vf});
  ASSERT_NE(Find(held, vf), nullptr) << "kept while held";
  EXPECT_EQ(Find(held, vf)->taints,
            (std::vector<DeviceTaint>{
                {"vfio.dra.io/lost", "vf-removed", kEffectNoSchedule, "2026-11-28T01:00:07Z"}}));
  EXPECT_TRUE(Find(held, vf)->consumes_counters.empty());
  EXPECT_THAT(held.taint_reasons.at(vf), HasSubstr(address + " is gone"));
  EXPECT_EQ(Find(held, vf)->attributes, Find(before, vf)->attributes);

  const PackedDeviceTable still = Table(held);
  const DesiredPool kept_again = Build("2026-11-28T01:09:00Z", &still, {vf});
  EXPECT_EQ(Find(kept_again, vf)->taints[0].time_added, "2026-11-28T01:00:07Z");
  const DesiredPool released = Build("2026-11-28T01:10:00Z", &still, {});
  EXPECT_EQ(Find(released, vf), nullptr) << "dropped once no claim holds it";
  EXPECT_EQ(Find(Build("2026-11-28T01:00:07Z", &published, {}), vf), nullptr)
      << "a gone device no claim holds goes at once";
}

// Issue 57: the kubelet deletes the node's slices when the plugin unregisters, and a held VF that
// goes before the next instance first publishes is known only from its claim's record. It is
// published from it, tainted lost, until the claim is unprepared.
TEST_F(DeviceTaintsTest, AHeldVfGoneWithNothingPublishedIsKeptTaintedLostFromItsRecord) {
  const DesiredPool before = Build("2026-11-28T01:00:00Z");
  const std::string address = scan_->inventory.Find("0000:5e:00.0")->sriov_pf->vfs.at(1);
  const std::string vf = Vf(address);
  ASSERT_NE(Find(before, vf), nullptr);
  recorded_[vf] = Find(before, vf)->attributes;
  std::filesystem::remove_all(node_.sysfs_root() + "/bus/pci/devices/" + address);

  const PackedDeviceTable empty(std::vector<const SliceDevice*>{});
  for (const PackedDeviceTable* nothing :
       {static_cast<const PackedDeviceTable*>(nullptr), &empty}) {
    SCOPED_TRACE(nothing == nullptr ? "before the first publish" : "an empty listing");
    const DesiredPool held = Build("2026-11-28T01:00:07Z", nothing, {vf});
    ASSERT_NE(Find(held, vf), nullptr) << "kept from the record while held";
    EXPECT_EQ(Find(held, vf)->taints,
              (std::vector<DeviceTaint>{
                  {"vfio.dra.io/lost", "vf-removed", kEffectNoSchedule, "2026-11-28T01:00:07Z"}}));
    EXPECT_EQ(Find(held, vf)->attributes, Find(before, vf)->attributes);
    EXPECT_TRUE(Find(held, vf)->consumes_counters.empty());
    EXPECT_THAT(held.taint_reasons.at(vf), HasSubstr(address + " is gone"));
    EXPECT_TRUE(held.kept.contains(vf));
    EXPECT_EQ(Find(Build("2026-11-28T01:00:07Z", nothing, {}), vf), nullptr) << "not held";
  }

  // Once published, it stands as published: the taint keeps its time.
  const PackedDeviceTable published = Table(Build("2026-11-28T01:00:07Z", nullptr, {vf}));
  const DesiredPool again = Build("2026-11-28T01:09:00Z", &published, {vf});
  ASSERT_NE(Find(again, vf), nullptr);
  EXPECT_EQ(Find(again, vf)->taints[0].time_added, "2026-11-28T01:00:07Z");
  EXPECT_EQ(Find(Build("2026-11-28T01:10:00Z", &published, {}), vf), nullptr) << "unprepared";
}

// A record whose attributes the server would refuse gives the name and the taint only, and the
// device stays so (it names no function to keep it by as published).
TEST_F(DeviceTaintsTest, AHeldGoneDeviceWhoseRecordedAttributesWouldBeRefusedKeepsOnlyItsName) {
  const DesiredPool before = Build("2026-11-28T01:00:00Z");
  const std::string address = scan_->inventory.Find("0000:5e:00.0")->sriov_pf->vfs.at(1);
  const std::string vf = Vf(address);
  ASSERT_NE(Find(before, vf), nullptr);
  recorded_[vf] = Find(before, vf)->attributes;
  recorded_[vf]["productName"] = std::string(65, 'x');
  std::filesystem::remove_all(node_.sysfs_root() + "/bus/pci/devices/" + address);

  const DesiredPool held = Build("2026-11-28T01:00:07Z", nullptr, {vf});
  ASSERT_NE(Find(held, vf), nullptr);
  EXPECT_TRUE(Find(held, vf)->attributes.empty());
  ASSERT_EQ(Find(held, vf)->taints.size(), 1u);
  EXPECT_EQ(Find(held, vf)->taints[0].key, "vfio.dra.io/lost");
  const PackedDeviceTable published = Table(held);
  const DesiredPool again = Build("2026-11-28T01:09:00Z", &published, {vf});
  ASSERT_NE(Find(again, vf), nullptr) << "no flapping";
  EXPECT_EQ(Find(again, vf)->taints[0].time_added, "2026-11-28T01:00:07Z");
}

// A held function that is still there but not built (the policy no longer selects it) is not
// lost: without a standing entry there is nothing to keep it as.
TEST_F(DeviceTaintsTest, AHeldDeviceWhoseFunctionIsStillThereIsNotTaintedLostFromItsRecord) {
  const DesiredPool before = Build("2026-11-28T01:00:00Z");
  const std::string address = scan_->inventory.Find("0000:5e:00.0")->sriov_pf->vfs.at(1);
  const std::string vf = Vf(address);
  ASSERT_NE(Find(before, vf), nullptr);
  recorded_["vf-gone-from-the-policy"] = Find(before, vf)->attributes;
  const DesiredPool held = Build("2026-11-28T01:00:07Z", nullptr, {"vf-gone-from-the-policy"});
  EXPECT_EQ(Find(held, "vf-gone-from-the-policy"), nullptr);
  EXPECT_TRUE(held.taint_reasons.empty());
}

// The kernel removes a VF in steps (pci_iov_remove_virtfn): the PF's virtfnN link and the VF's
// physfn link go, then the VF's driver lets go, then the VF leaves the bus. A scan between the
// first and last step finds a function that is no VF of the PF any more. A claim's VF must not be
// dropped then: the next scan, which finds it gone, could no longer taint it lost (the e2e
// hot-remove scenario met this on the QEMU node).
TEST_F(DeviceTaintsTest, AHeldVfHalfWayThroughItsRemovalStaysAndIsTaintedLostOnceGone) {
  const DesiredPool before = Build("2026-11-28T01:00:00Z");
  const std::string pf_dir = node_.sysfs_root() + "/bus/pci/devices/0000:5e:00.0";
  const std::string address = scan_->inventory.Find("0000:5e:00.0")->sriov_pf->vfs.at(1);
  const std::string vf = Vf(address);
  ASSERT_NE(Find(before, vf), nullptr);
  const PackedDeviceTable published = Table(before);
  std::filesystem::remove(pf_dir + "/virtfn1");
  std::filesystem::remove(node_.sysfs_root() + "/bus/pci/devices/" + address + "/physfn");

  const DesiredPool unlinked = Build("2026-11-28T01:00:01Z", &published, {vf});
  ASSERT_TRUE(scan_->inventory.Listed(address));
  ASSERT_NE(Find(unlinked, vf), nullptr) << "kept while held";
  EXPECT_TRUE(Find(unlinked, vf)->taints.empty()) << "nothing is wrong with it yet";
  EXPECT_EQ(Find(unlinked, vf)->attributes, Find(before, vf)->attributes);
  EXPECT_EQ(Find(Build("2026-11-28T01:00:01Z", &published, {}), vf), nullptr)
      << "one no claim holds is no longer offered";

  const PackedDeviceTable still = Table(unlinked);
  std::filesystem::remove_all(node_.sysfs_root() + "/bus/pci/devices/" + address);
  const DesiredPool gone = Build("2026-11-28T01:00:02Z", &still, {vf});
  ASSERT_NE(Find(gone, vf), nullptr);
  EXPECT_EQ(Find(gone, vf)->taints,
            (std::vector<DeviceTaint>{
                {"vfio.dra.io/lost", "vf-removed", kEffectNoSchedule, "2026-11-28T01:00:02Z"}}));
}

TEST_F(DeviceTaintsTest, AGroupThatGainsAHostFunctionTaintsItsPublishedDeviceGroupUnsafe) {
  const DesiredPool before = Build("2026-11-28T01:00:00Z");
  ASSERT_NE(Find(before, kGpu), nullptr);
  const PackedDeviceTable published = Table(before);
  testing::SysfsFixture(node_.sysfs_root())
      .AddPci(testing::MakePciSpec("0000:01:00.2", 0x8086, 0x10d3, 0x020000, "e1000e", 10, 0));

  const DesiredPool after = Build("2026-11-28T01:00:03Z", &published);
  ASSERT_NE(Find(after, kGpu), nullptr);
  ASSERT_EQ(Find(after, kGpu)->taints.size(), 1u);
  EXPECT_EQ(Find(after, kGpu)->taints[0].key, "vfio.dra.io/group-unsafe");
  EXPECT_EQ(Find(after, kGpu)->taints[0].effect, kEffectNoSchedule);
  EXPECT_THAT(after.taint_reasons.at(kGpu), HasSubstr("0000:01:00.2"));
  EXPECT_EQ(Find(Build("2026-11-28T01:00:03Z"), kGpu), nullptr)
      << "never published before: not offered at all";

  std::filesystem::remove_all(node_.sysfs_root() + "/bus/pci/devices/0000:01:00.2");
  std::filesystem::remove(node_.sysfs_root() + "/kernel/iommu_groups/10/devices/0000:01:00.2");
  const PackedDeviceTable tainted = Table(after);
  EXPECT_TRUE(Find(Build("2026-11-28T01:00:09Z", &tainted), kGpu)->taints.empty());
}

// A claim's GPU that someone binds to a third driver: the VM lost it. Its own driver (between
// prepare's steps, or after a reboot) and no driver (mid-switch) are not that.
TEST_F(DeviceTaintsTest, AHeldFunctionBoundToAThirdDriverTaintsItsDeviceDriverChanged) {
  context_.managed["0000:01:00.0"] = {"nvidia", "vfio-pci"};
  context_.managed["0000:01:00.1"] = {"snd_hda_intel", "vfio-pci"};
  BindTo("0000:01:00.0", "vfio-pci");
  BindTo("0000:01:00.1", "vfio-pci");
  EXPECT_TRUE(Find(Build("2026-11-28T01:00:00Z"), kGpu)->taints.empty());
  BindTo("0000:01:00.0", "nvidia");
  EXPECT_TRUE(Find(Build("2026-11-28T01:00:00Z"), kGpu)->taints.empty()) << "its own driver";
  std::filesystem::remove(node_.sysfs_root() + "/bus/pci/devices/0000:01:00.0/driver");
  EXPECT_TRUE(Find(Build("2026-11-28T01:00:00Z"), kGpu)->taints.empty()) << "mid-switch";

  BindTo("0000:01:00.0", "vfio-pci");
  BindTo("0000:01:00.1", "some_other_audio");
  const DesiredPool pool = Build("2026-11-28T01:00:02Z");
  ASSERT_EQ(Find(pool, kGpu)->taints.size(), 1u);
  EXPECT_EQ(Find(pool, kGpu)->taints[0], (DeviceTaint{"vfio.dra.io/unhealthy", "driver-changed",
                                                      kEffectNoSchedule, "2026-11-28T01:00:02Z"}));
  EXPECT_THAT(pool.taint_reasons.at(kGpu),
              HasSubstr("0000:01:00.1, prepared for a claim, was bound to some_other_audio"));
}

TEST(DeviceTaintRules, TheValidatorAppliesTheServersRules) {
  DesiredPool pool;
  pool.name = "node-1";
  pool.slices.emplace_back();
  SliceDevice device{
      "gpu-1",
      {},
      {},
      {{"vfio.dra.io/unhealthy", "aer-fatal", kEffectNoSchedule, "2026-11-28T01:00:00Z"}}};
  pool.slices[0].devices.push_back(device);
  const ValidationTarget v137{37, kDriver, "node-1", CounterLayout::kOwnSlice, true};
  EXPECT_TRUE(ValidatePool(pool, v137).ok());
  EXPECT_THAT(
      ValidatePool(pool, {37, kDriver, "node-1", CounterLayout::kOwnSlice, false}).error().message,
      HasSubstr("taints are not supported by this server"));
  pool.slices[0].devices[0].taints[0].effect = kEffectNone;
  EXPECT_THAT(ValidatePool(pool, {34, kDriver, "node-1", CounterLayout::kInDeviceSlice, true})
                  .error()
                  .message,
              HasSubstr("effect None needs Kubernetes 1.35"));
  pool.slices[0].devices[0].taints[0].value = "not a label value";
  EXPECT_THAT(ValidatePool(pool, v137).error().message, HasSubstr("is not a label value"));
  pool.slices[0].devices[0].taints[0] = {"vfio.dra.io/a", "", kEffectNone, ""};
  pool.slices[0].devices[0].taints.resize(5, pool.slices[0].devices[0].taints[0]);
  EXPECT_THAT(
      ValidatePool(pool, {36, kDriver, "node-1", CounterLayout::kOwnSlice, true}).error().message,
      HasSubstr("at most 4 items, has 5"));
  EXPECT_TRUE(ValidatePool(pool, v137).ok()) << "16 per device from 1.37";
}

TEST(DeviceTaintRules, TaintsSurviveJsonInEveryVersionAndThePackedTable) {
  const SliceDevice device{
      "gpu-1",
      {{attribute::kType, std::string("gpu")}},
      {},
      {{"vfio.dra.io/degraded", "pf-link-down", kEffectNone, "2026-11-28T01:00:00Z"},
       {"vfio.dra.io/unhealthy", "aer-fatal", kEffectNoSchedule, "2026-11-28T01:00:01Z"}}};
  const SliceContent content{{device}, {}};
  for (const char* version : {"v1", "v1beta2", "v1beta1"}) {
    SliceMeta meta;
    meta.api_version = version;
    meta.driver = kDriver;
    meta.node_name = "node-1";
    meta.pool_name = "node-1";
    const nlohmann::json json = SliceToJson(content, meta);
    auto back = SliceContentFromJson(json);
    ASSERT_TRUE(back.ok()) << version;
    EXPECT_EQ(*back, content) << version << ": " << json.dump();
  }
  const PackedDeviceTable table({&device});
  EXPECT_EQ(table.Find("gpu-1"), device);
}

}  // namespace
}  // namespace vfio_dra::slicepublisher
