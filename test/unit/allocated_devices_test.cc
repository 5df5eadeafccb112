// A republish never drops or changes a device a prepared claim holds (issue 53 item 6;
// kubernetes#140802: the scheduler subtracts an allocated device's counter consumption as the
// slices show it now, so a slice without the device, or with its consumption changed, offers what
// the device still uses). On the vgpu-vf fixture (an idle H100 0000:41:00.0 with 4 VFs) under a
// policy that pins H100-40C, of which the GPU holds 2: the GPU's counter set has capacity 2 and
// every 40C on it consumes 1. Claims hold the 40Cs offered on two of its VFs; the node then changes
// in each way that makes a republish, and each held device must be published as it was (taints
// aside), its counter sets published beside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <set>

#include "discovery/admin_policy.h"
#include "slicepublisher/device_names.h"
#include "slicepublisher/packed_device_table.h"
#include "slicepublisher/publishable_pool.h"
#include "slicepublisher/published_devices.h"
#include "slicepublisher/slice_builder.h"
#include "sysfs_fixture.h"
#include "unit/fixture_node.h"

namespace vfio_dra::slicepublisher {
namespace {

constexpr char kDriver[] = "vfio.dra.io";
constexpr char kPf[] = "0000:41:00.0";

// The admin's policy before any cause: 40C (1415) pinned on the idle H100.
discovery::AdminPolicy Pinned40C() {
  auto policy = discovery::ParseAdminPolicy(
      "select:\n  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"1415\"}\n", "p");
  EXPECT_TRUE(policy.ok()) << policy.error().message;
  return *policy;
}

struct Built {
  DesiredPool pool;
  std::shared_ptr<const discovery::NodeScan> scan;
};

Built Build(const testing::FixtureNode& node, const discovery::AdminPolicy& policy, int minor,
            const DesiredPool* published, const std::set<std::string>& held) {
  sysfs::SysfsReader sysfs(node.sysfs_root());
  Built out;
  out.scan = discovery::ScanNode(sysfs, nullptr, policy, {});
  const PackedDeviceTable table = [&] {
    std::vector<const SliceDevice*> all;
    if (published != nullptr) {
      for (const SliceContent& slice : published->slices) {
        for (const SliceDevice& device : slice.devices) all.push_back(&device);
      }
    }
    return PackedDeviceTable(all);
  }();
  const std::map<std::string, CounterSet> sets =
      published != nullptr ? CounterSetsOf(published->slices) : std::map<std::string, CounterSet>{};
  TaintInputs taints;
  taints.driver = kDriver;
  taints.now = "2026-11-29T01:00:00Z";
  taints.published = published != nullptr ? &table : nullptr;
  taints.published_sets = published != nullptr ? &sets : nullptr;
  taints.held = held;
  ServerProfile profile;
  profile.kubernetes_minor = minor;
  PublishablePool built =
      BuildPublishablePool(BuilderInput(*out.scan), {"node-1", kDriver, profile}, {}, &taints);
  EXPECT_TRUE(built.valid.ok()) << built.valid.error().message;
  out.pool = std::move(built.pool);
  return out;
}

// The slice holding `name` and the device in it; nulls when no slice does.
std::pair<const SliceContent*, const SliceDevice*> Find(const DesiredPool& pool,
                                                        const std::string& name) {
  for (const SliceContent& slice : pool.slices) {
    for (const SliceDevice& device : slice.devices) {
      if (device.name == name) return {&slice, &device};
    }
  }
  return {nullptr, nullptr};
}

struct Cause {
  std::string name;
  // Changes the node (or returns the policy the admin changed to).
  std::function<discovery::AdminPolicy(const testing::FixtureNode&,
                                       const std::vector<std::string>&)>
      apply;
};

class AllocatedDevicesTest : public ::testing::TestWithParam<int> {};

TEST_P(AllocatedDevicesTest, NoRepublishDropsOrChangesAHeldDeviceOrItsCounterUse) {
  const int minor = GetParam();
  const auto write = [](const testing::FixtureNode& node, const std::string& relative,
                        const std::string& text) {
    testing::SysfsFixture(node.sysfs_root()).WriteFile(relative, text);
  };
  const std::vector<Cause> causes = {
      {"the policy stops offering vGPUs",
       [](const testing::FixtureNode&, const std::vector<std::string>&) {
         auto policy = discovery::ParseAdminPolicy("version: v1\nkinds:\n  vgpu: false\n", "p");
         EXPECT_TRUE(policy.ok()) << policy.error().message;
         return *policy;
       }},
      {"the held vGPU is created on its VF (the type is set)",
       [&](const testing::FixtureNode& node, const std::vector<std::string>& vfs) {
         // As the driver shows it: the VF lists nothing, its siblings only the type that runs.
         write(node, "bus/pci/devices/" + vfs[0] + "/nvidia/current_vgpu_type", "1415\n");
         write(node, "bus/pci/devices/" + vfs[0] + "/nvidia/creatable_vgpu_types",
               "ID    : vGPU Name\n");
         for (size_t i = 1; i < vfs.size(); ++i) {
           write(node, "bus/pci/devices/" + vfs[i] + "/nvidia/creatable_vgpu_types",
                 "ID    : vGPU Name\n1415  : NVIDIA H100-40C\n");
         }
         return Pinned40C();
       }},
      {"another type is set on a held VF behind the plugin's back",
       [&](const testing::FixtureNode& node, const std::vector<std::string>& vfs) {
         write(node, "bus/pci/devices/" + vfs[1] + "/nvidia/current_vgpu_type", "1416\n");
         return Pinned40C();
       }},
      {"a held VF counts fatal PCIe errors (taint)",
       [&](const testing::FixtureNode& node, const std::vector<std::string>& vfs) {
         write(node, "bus/pci/devices/" + vfs[0] + "/aer_dev_fatal", "TOTAL_ERR_FATAL 2\n");
         return Pinned40C();
       }},
      {"sriov_numvfs is lowered: a held VF goes",
       [&](const testing::FixtureNode& node, const std::vector<std::string>& vfs) {
         const std::string pf = node.sysfs_root() + "/bus/pci/devices/" + kPf;
         std::filesystem::remove(pf + "/virtfn1");
         std::filesystem::remove_all(node.sysfs_root() + "/bus/pci/devices/" + vfs[1]);
         write(node, std::string("bus/pci/devices/") + kPf + "/sriov_numvfs", "1\n");
         return Pinned40C();
       }},
      {"nothing changes",
       [](const testing::FixtureNode&, const std::vector<std::string>&) { return Pinned40C(); }},
  };
  for (const Cause& cause : causes) {
    SCOPED_TRACE(cause.name + " (Kubernetes 1." + std::to_string(minor) + ")");
    testing::FixtureNode node("vgpu-vf");
    const Built first = Build(node, Pinned40C(), minor, nullptr, {});
    const std::vector<std::string> vfs = first.scan->inventory.Find(kPf)->sriov_pf->vfs;
    ASSERT_GE(vfs.size(), 2u);
    // Claims were allocated the 40Cs offered on VF 0 and VF 1, and prepared.
    const std::set<std::string> held = {VgpuDeviceName(vfs[0], 1415), VgpuDeviceName(vfs[1], 1415)};
    for (const std::string& name : held) {
      const SliceDevice* device = Find(first.pool, name).second;
      ASSERT_NE(device, nullptr) << name;
      ASSERT_FALSE(device->consumes_counters.empty()) << name;
    }
    const discovery::AdminPolicy policy = cause.apply(node, vfs);
    const Built again = Build(node, policy, minor, &first.pool, held);
    const std::map<std::string, CounterSet> sets_before = CounterSetsOf(first.pool.slices);
    const std::map<std::string, CounterSet> sets_after = CounterSetsOf(again.pool.slices);
    for (const std::string& name : held) {
      SCOPED_TRACE(name);
      const SliceDevice* before = Find(first.pool, name).second;
      const auto [slice, after] = Find(again.pool, name);
      ASSERT_NE(after, nullptr) << "a held device was dropped";
      EXPECT_EQ(after->attributes, before->attributes);
      EXPECT_EQ(after->consumes_counters, before->consumes_counters);
      for (const CounterConsumption& used : after->consumes_counters) {
        ASSERT_TRUE(sets_after.count(used.counter_set)) << used.counter_set << " is not published";
        EXPECT_EQ(sets_after.at(used.counter_set), sets_before.at(used.counter_set));
        if (minor < 35) {  // the set must share the device's slice
          bool beside = false;
          for (const CounterSet& set : slice->shared_counters)
            beside |= set.name == used.counter_set;
          EXPECT_TRUE(beside) << used.counter_set;
        }
      }
    }
    // Once the claims are released the pool is still one the server takes (Build checks).
    Build(node, policy, minor, &again.pool, {});
  }
}

INSTANTIATE_TEST_SUITE_P(CounterLayouts, AllocatedDevicesTest, ::testing::Values(34, 37));

}  // namespace
}  // namespace vfio_dra::slicepublisher
