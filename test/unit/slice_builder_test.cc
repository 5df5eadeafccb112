#include "slicepublisher/slice_builder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "base/k8s_names.h"
#include "simulated_kernel.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/device_names.h"
#include "slicepublisher/packed_device_table.h"
#include "slicepublisher/publishable_pool.h"
#include "slicepublisher/server_profile.h"
#include "slicepublisher/slice_digest.h"
#include "slicepublisher/slice_json.h"
#include "slicepublisher/slice_validator.h"
#include "unit/fixture_node.h"

namespace vfio_dra::slicepublisher {
namespace {

using ::testing::HasSubstr;
using vfio_dra::testing::FixtureNode;

struct Built {
  DesiredPool pool;
  std::shared_ptr<const discovery::NodeScan> scan;
};

Built Build(const FixtureNode& node, CounterLayout layout) {
  sysfs::SysfsReader sysfs(node.sysfs_root());
  auto names = discovery::PciNames::Open({node.sysfs_root(), node.pci_ids(), false});
  auto scan = discovery::ScanNode(sysfs, names.ok() ? names->get() : nullptr, {});
  MdevTypeMaxima capacity;
  capacity.Observe(scan->inventory);
  return {BuildDesiredPool(*scan, {"node-1", layout}, capacity), scan};
}

const SliceDevice* FindDevice(const DesiredPool& pool, const std::string& name) {
  for (const auto& slice : pool.slices) {
    for (const auto& device : slice.devices) {
      if (device.name == name) return &device;
    }
  }
  return nullptr;
}

std::string StringAttr(const SliceDevice& device, const std::string& key) {
  auto it = device.attributes.find(key);
  return it == device.attributes.end() ? "" : std::get<std::string>(it->second);
}

class EveryFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryFixture, PublishesValidSlicesForEachRelease) {
  FixtureNode node(GetParam());
  for (int minor : {34, 35, 36, 37, 38}) {
    ServerProfile profile{"v1", minor, false};
    Built built = Build(node, profile.Layout());
    Status s = ValidatePool(built.pool, {minor, "vfio.dra.io", "node-1", profile.Layout()});
    EXPECT_TRUE(s.ok()) << GetParam() << " 1." << minor << ": " << s.error().message;
    size_t devices = 0;
    for (const auto& slice : built.pool.slices) devices += slice.devices.size();
    EXPECT_GE(devices, built.scan->selection.devices.size());
    // The JSON round trip keeps every device and counter (v1 and v1beta1 shapes).
    for (const char* api : {"v1", "v1beta1"}) {
      for (const auto& slice : built.pool.slices) {
        SliceMeta meta{api, "vfio.dra.io", "node-1", "node-1", 1, 1, "", "", ""};
        auto back = SliceContentFromJson(SliceToJson(slice, meta));
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(*back, slice) << GetParam() << " " << api;
      }
    }
  }
}

// The attribute names 1.38 accepts (one '/' at most) and its Go helper allows (none in the
// driver's own domain), for every device of every fixture, with and without counters and taints.
TEST_P(EveryFixture, AttributeNamesFollowThe138Rules) {
  FixtureNode node(GetParam());
  TaintInputs taints;
  taints.driver = "vfio.dra.io";
  taints.now = "2026-11-28T00:00:00Z";
  sysfs::SysfsReader sysfs(node.sysfs_root());
  auto names = discovery::PciNames::Open({node.sysfs_root(), node.pci_ids(), false});
  auto scan = discovery::ScanNode(sysfs, names.ok() ? names->get() : nullptr, {});
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  size_t checked = 0;
  for (CounterLayout layout :
       {CounterLayout::kNone, CounterLayout::kInDeviceSlice, CounterLayout::kOwnSlice}) {
    const DesiredPool pool = BuildDesiredPool(*scan, {"node-1", layout, &taints}, maxima);
    for (const auto& slice : pool.slices) {
      for (const auto& device : slice.devices) {
        for (const auto& [name, value] : device.attributes) {
          ++checked;
          EXPECT_LE(std::count(name.begin(), name.end(), '/'), 1) << GetParam() << " " << name;
          EXPECT_NE(name.rfind("vfio.dra.io/", 0), 0u) << GetParam() << " " << name;
          EXPECT_TRUE(IsQualifiedName(name)) << GetParam() << " " << name;
        }
      }
    }
    if (layout == CounterLayout::kOwnSlice) {
      Status s = ValidatePool(pool, {38, "vfio.dra.io", "node-1", layout});
      EXPECT_TRUE(s.ok()) << GetParam() << ": " << s.error().message;
    }
  }
  if (!scan->selection.devices.empty()) {
    EXPECT_GT(checked, 0u) << GetParam();
  }
}

// What the reconciler keeps between scans builds exactly what the whole scan builds, under every
// counter layout and with taints, and keeps no more functions than are published (with their
// companions and PFs), are mdev parents or are refused for their IOMMU group.
TEST_P(EveryFixture, BuilderInputBuildsTheSamePool) {
  FixtureNode node(GetParam());
  Built built = Build(node, CounterLayout::kOwnSlice);
  const discovery::NodeScan kept = BuilderInput(*built.scan);
  MdevTypeMaxima whole_maxima;
  whole_maxima.Observe(built.scan->inventory);
  MdevTypeMaxima kept_maxima;
  kept_maxima.Observe(kept.inventory);
  TaintInputs taints;
  taints.driver = "vfio.dra.io";
  taints.now = "2026-11-28T00:00:00Z";
  for (CounterLayout layout :
       {CounterLayout::kNone, CounterLayout::kInDeviceSlice, CounterLayout::kOwnSlice}) {
    for (const TaintInputs* with : std::vector<const TaintInputs*>{nullptr, &taints}) {
      const BuildOptions options{"node-1", layout, with};
      const DesiredPool from_whole = BuildDesiredPool(*built.scan, options, whole_maxima);
      const DesiredPool from_kept = BuildDesiredPool(kept, options, kept_maxima);
      EXPECT_EQ(from_kept.slices, from_whole.slices) << GetParam();
      EXPECT_EQ(from_kept.warnings, from_whole.warnings) << GetParam();
      EXPECT_EQ(from_kept.taint_reasons, from_whole.taint_reasons) << GetParam();
    }
  }
  size_t needed = built.scan->inventory.mdev_parents.size() + built.scan->selection.vgpu_vfs.size();
  std::set<std::string> pfs;
  for (const auto& selected : built.scan->selection.devices) {
    needed += 1 + selected.companions.size();
    const discovery::PciFunction* fn = built.scan->inventory.Find(selected.address);
    if (fn != nullptr && fn->sriov_vf) pfs.insert(fn->sriov_vf->pf);
  }
  for (const auto& selected : built.scan->selection.vgpu_vfs) {
    const discovery::PciFunction* fn = built.scan->inventory.Find(selected.address);
    if (fn != nullptr && fn->sriov_vf) pfs.insert(fn->sriov_vf->pf);
  }
  size_t group_unsafe = 0;
  for (const auto& [address, decision] : built.scan->selection.functions) {
    group_unsafe += decision.group_unsafe ? 1 : 0;
  }
  EXPECT_LE(kept.inventory.functions.size(), needed + pfs.size() + 2 * group_unsafe);
  EXPECT_EQ(kept.selection.functions.size(), group_unsafe);
  EXPECT_EQ(kept.inventory.listed, built.scan->inventory.listed);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EveryFixture,
                         ::testing::ValuesIn(vfio_dra::testing::FixtureNames()));

TEST(SliceBuilder, PciDevicesCarryTheStandardAndDriverAttributes) {
  FixtureNode node("sriov");
  Built built = Build(node, CounterLayout::kOwnSlice);
  const SliceDevice* vf = FindDevice(built.pool, "vf-0000-5e-02-3");
  ASSERT_NE(vf, nullptr);
  EXPECT_EQ(StringAttr(*vf, "resource.kubernetes.io/pciBusID"), "0000:5e:02.3");
  EXPECT_EQ(StringAttr(*vf, "resource.kubernetes.io/pcieRoot"), "pci0000:5d");
  EXPECT_EQ(std::get<int64_t>(vf->attributes.at("resource.kubernetes.io/numaNode")), 0);
  EXPECT_EQ(StringAttr(*vf, "type"), "vf");
  EXPECT_EQ(StringAttr(*vf, "vendorID"), "8086");
  EXPECT_EQ(StringAttr(*vf, "deviceID"), "154c");
  EXPECT_EQ(StringAttr(*vf, "productName"), "Ethernet Virtual Function 700 Series");
  EXPECT_EQ(std::get<int64_t>(vf->attributes.at("iommuGroup")), 54);
  EXPECT_EQ(StringAttr(*vf, "pfPciAddress"), "0000:5e:00.0");
  EXPECT_EQ(std::get<int64_t>(vf->attributes.at("vfIndex")), 3);
  EXPECT_EQ(StringAttr(*vf, "netdev"), "ens785f0v3");
  EXPECT_EQ(vf->attributes.count("mdevUUID"), 0u);

  // What prepare and health read back is what the builder wrote.
  const PublishedDeviceView view = DecodePublishedDevice(*vf);
  EXPECT_EQ(view.name, "vf-0000-5e-02-3");
  EXPECT_EQ(view.type, "vf");
  EXPECT_FALSE(view.IsMdev());
  EXPECT_EQ(view.pci_bus_id, "0000:5e:02.3");
  EXPECT_EQ(view.vendor_id, 0x8086u);
  EXPECT_EQ(view.device_id, 0x154cu);
  EXPECT_EQ(view.iommu_group, 54);
  EXPECT_EQ(view.mdev_uuid, std::nullopt);
}

// Issue 58: a VF a claim holds is on vfio-pci, where it has no netdev; it is published as it was
// (with the netdev it had), or every prepare and unprepare of a network VF rewrote its slice.
TEST(SliceBuilder, AVfAClaimHoldsKeepsTheNetdevItWasPublishedWith) {
  FixtureNode node("sriov");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  vfio_dra::testing::SimulatedKernel kernel(node.sysfs_root(), node.dir() + "/dev");
  const std::string vf = "0000:5e:02.3";
  const std::string pci = node.sysfs_root() + "/bus/pci/";
  TaintInputs taints;
  taints.driver = "vfio.dra.io";
  taints.now = "2026-11-29T00:00:00Z";
  const PoolTarget target{"node-1", "vfio.dra.io", ServerProfile{"v1", 35, false}};
  const auto before = discovery::ScanNode(sysfs, nullptr, {});
  MdevTypeMaxima maxima;
  const PublishablePool published = BuildPublishablePool(*before, target, maxima, &taints);
  const SliceDevice* was = FindDevice(published.pool, "vf-0000-5e-02-3");
  ASSERT_NE(was, nullptr);
  ASSERT_EQ(StringAttr(*was, "netdev"), "ens785f0v3");

  ASSERT_EQ(kernel.Write(pci + "devices/" + vf + "/driver_override", "vfio-pci"), 0);
  ASSERT_EQ(kernel.Write(pci + "drivers/iavf/unbind", vf), 0);
  ASSERT_EQ(kernel.Write(pci + "drivers/vfio-pci/bind", vf), 0);
  std::filesystem::remove_all(pci + "devices/" + vf + "/net");
  discovery::ScanContext held;
  held.managed[vf] = {"iavf", "vfio-pci"};
  const auto prepared = discovery::ScanNode(sysfs, nullptr, {}, held);
  ASSERT_TRUE(prepared->inventory.Find(vf)->netdevs.empty());
  std::vector<const SliceDevice*> devices;
  for (const auto& slice : published.pool.slices) {
    for (const auto& device : slice.devices) devices.push_back(&device);
  }
  const PackedDeviceTable table(devices);
  taints.published = &table;
  taints.held = {"vf-0000-5e-02-3"};
  const PublishablePool now = BuildPublishablePool(*prepared, target, maxima, &taints);
  const SliceDevice* is = FindDevice(now.pool, "vf-0000-5e-02-3");
  ASSERT_NE(is, nullptr);
  EXPECT_EQ(is->attributes, was->attributes);
  ASSERT_EQ(now.pool.slices.size(), published.pool.slices.size());
  for (size_t i = 0; i < now.pool.slices.size(); ++i) {
    EXPECT_EQ(DigestOf(now.pool.slices[i]).content, DigestOf(published.pool.slices[i]).content)
        << "slice " << i << " would be rewritten";
  }
  // A server that takes no taints (1.32) gets it too.
  const PoolTarget old_server{"node-1", "vfio.dra.io", ServerProfile{"v1beta1", 32, false}};
  const PublishablePool on_132 = BuildPublishablePool(*prepared, old_server, maxima, &taints);
  const SliceDevice* on_old = FindDevice(on_132.pool, "vf-0000-5e-02-3");
  ASSERT_NE(on_old, nullptr);
  EXPECT_EQ(StringAttr(*on_old, "netdev"), "ens785f0v3");
}

TEST(SliceBuilder, MdevInstancesGetStableUuidsAndCounters) {
  FixtureNode node("mtty");
  Built first = Build(node, CounterLayout::kOwnSlice);
  Built second = Build(node, CounterLayout::kOwnSlice);
  EXPECT_EQ(first.pool.slices, second.pool.slices);  // same node, same slices and UUIDs
  // lcm(24, 12) = 24: mtty-1 takes 1, mtty-2 takes 2.
  ASSERT_FALSE(first.pool.slices[0].shared_counters.empty());
  EXPECT_EQ(first.pool.slices[0].shared_counters[0].name, "mdev-parent-mtty");
  EXPECT_EQ(first.pool.slices[0].shared_counters[0].counters.at("capacity"), 24);
  const SliceDevice* one = FindDevice(first.pool, "mdev-mtty-mtty-1-0");
  const SliceDevice* two = FindDevice(first.pool, "mdev-mtty-mtty-2-11");
  ASSERT_TRUE(one && two);
  EXPECT_EQ(StringAttr(*one, "mdevUUID"), MdevInstanceUuid("node-1", "mtty", "mtty-1", 0));
  EXPECT_EQ(one->consumes_counters[0].counters.at("capacity"), 1);
  EXPECT_EQ(two->consumes_counters[0].counters.at("capacity"), 2);
  EXPECT_EQ(FindDevice(first.pool, "mdev-mtty-mtty-2-12"), nullptr);
  EXPECT_EQ(StringAttr(*one, "type"), "mdev");
  EXPECT_EQ(one->attributes.count("resource.kubernetes.io/pciBusID"), 0u);
  EXPECT_EQ(one->attributes.count("parentPciAddress"), 0u);

  const PublishedDeviceView view = DecodePublishedDevice(*one);
  EXPECT_TRUE(view.IsMdev());
  EXPECT_EQ(view.mdev_uuid, MdevInstanceUuid("node-1", "mtty", "mtty-1", 0));
  EXPECT_EQ(view.mdev_type, "mtty-1");
  EXPECT_EQ(view.mdev_parent, "mtty");
  EXPECT_EQ(view.pci_bus_id, std::nullopt);
  EXPECT_EQ(view.parent_pci_address, std::nullopt);
}

TEST(SliceBuilder, ExistingInstancesAreAccountedForAndTheWholeGpuNoLongerFits) {
  FixtureNode node("vgpu");
  Built built = Build(node, CounterLayout::kOwnSlice);
  // nvidia-223 was seen with 7 available + 1 existing = 8; the existing (foreign) one holds 1/8.
  ASSERT_EQ(built.pool.slices[0].shared_counters.size(), 1u);
  EXPECT_EQ(built.pool.slices[0].shared_counters[0].counters.at("capacity"), 7);
  const SliceDevice* whole = FindDevice(built.pool, "gpu-0000-3b-00-0");
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(whole->consumes_counters[0].counters.at("capacity"), 8);
  const SliceDevice* existing = FindDevice(built.pool, "mdev-4b20d080-1b54-4048-85b3-a6a62d165c01");
  ASSERT_NE(existing, nullptr);
  EXPECT_TRUE(existing->consumes_counters.empty());
  EXPECT_EQ(StringAttr(*existing, "mdevUUID"), "4b20d080-1b54-4048-85b3-a6a62d165c01");
  EXPECT_EQ(std::get<int64_t>(existing->attributes.at("iommuGroup")), 100);
  EXPECT_EQ(StringAttr(*existing, "parentPciAddress"), "0000:3b:00.0");
}

TEST(SliceBuilder, WithoutCountersOnlyWholeDevicesAndExistingInstances) {
  FixtureNode node("vgpu");
  Built built = Build(node, CounterLayout::kNone);
  size_t devices = 0;
  for (const auto& slice : built.pool.slices) {
    EXPECT_TRUE(slice.shared_counters.empty());
    for (const auto& device : slice.devices) {
      EXPECT_TRUE(device.consumes_counters.empty());
      ++devices;
    }
  }
  EXPECT_EQ(devices, 2u);  // the T4 and its one existing instance
}

TEST(SliceBuilder, LayoutsPutCountersWhereEachReleaseWantsThem) {
  FixtureNode node("vgpu");
  Built own = Build(node, CounterLayout::kOwnSlice);
  for (const auto& slice : own.pool.slices) {
    EXPECT_TRUE(slice.devices.empty() || slice.shared_counters.empty());
  }
  Built same = Build(node, CounterLayout::kInDeviceSlice);
  bool together = false;
  for (const auto& slice : same.pool.slices) {
    if (!slice.devices.empty() && !slice.shared_counters.empty()) together = true;
  }
  EXPECT_TRUE(together);
}

TEST(SliceBuilder, AThousandDevicesSplitIntoFullSlices) {
  FixtureNode node("");
  vfio_dra::testing::BuildLargeNode(node.sysfs_root(), 3000);
  Built built = Build(node, CounterLayout::kOwnSlice);
  ASSERT_EQ(built.scan->selection.devices.size(), 1000u);
  ASSERT_EQ(built.pool.slices.size(), 8u);  // 7 x 128 + 104
  std::set<std::string> names;
  for (size_t i = 0; i < built.pool.slices.size(); ++i) {
    EXPECT_EQ(built.pool.slices[i].devices.size(), i < 7 ? 128u : 104u);
    for (const auto& d : built.pool.slices[i].devices) names.insert(d.name);
  }
  EXPECT_EQ(names.size(), 1000u);
  EXPECT_TRUE(
      ValidatePool(built.pool, {35, "vfio.dra.io", "node-1", CounterLayout::kOwnSlice}).ok());
}

// One tainted device among more than 64 plain ones: on 1.35 the server takes at most 64 devices
// in a slice that has a taint, so the plain list is packed at 64 and the validator (the server's
// rules) accepts it; 1.34 has no effect None, so such taints are left out there (and nothing is
// packed smaller), while NoSchedule ones stay.
TEST(SliceBuilder, ATaintPacksPlainDevicesAt64On135AndEffectNoneIsLeftOutOn134) {
  FixtureNode node("");
  vfio_dra::testing::BuildLargeNode(node.sysfs_root(), 200);  // 67 GPUs with their audio
  const std::string devices = node.sysfs_root() + "/bus/pci/devices/";
  std::ofstream(devices + "0000:01:00.0/aer_dev_fatal") << "Undefined 0\nTOTAL_ERR_FATAL 1\n";
  std::ofstream(devices + "0000:01:02.0/aer_dev_fatal") << "TOTAL_ERR_FATAL ?\n";
  sysfs::SysfsReader sysfs(node.sysfs_root());
  auto scan = discovery::ScanNode(sysfs, nullptr, {});
  ASSERT_EQ(scan->selection.devices.size(), 67u);
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  TaintInputs taints;
  taints.driver = "vfio.dra.io";
  taints.now = "2026-11-28T00:00:00Z";
  const auto slice_sizes = [](const DesiredPool& pool) {
    std::vector<size_t> sizes;
    for (const auto& slice : pool.slices) {
      if (!slice.devices.empty()) sizes.push_back(slice.devices.size());
    }
    std::sort(sizes.rbegin(), sizes.rend());
    return sizes;
  };
  const auto causes = [](const DesiredPool& pool, const std::string& device) {
    std::vector<std::string> out;
    const SliceDevice* found = FindDevice(pool, device);
    if (found == nullptr) return std::vector<std::string>{"not published"};
    for (const DeviceTaint& taint : found->taints) out.push_back(taint.key + " " + taint.effect);
    return out;
  };

  const PublishablePool v135 = BuildPublishablePool(
      *scan, {"node-1", "vfio.dra.io", ServerProfile{"v1", 35, false}}, maxima, &taints);
  ASSERT_TRUE(v135.valid.ok()) << v135.valid.error().message;
  EXPECT_EQ(slice_sizes(v135.pool), (std::vector<size_t>{64, 3}));
  EXPECT_EQ(causes(v135.pool, "gpu-0000-01-00-0"),
            std::vector<std::string>{"vfio.dra.io/unhealthy NoSchedule"});
  EXPECT_EQ(causes(v135.pool, "gpu-0000-01-02-0"),
            std::vector<std::string>{"vfio.dra.io/unmonitored None"});
  EXPECT_EQ(v135.pool.taint_reasons.size(), 2u);

  const PublishablePool v134 = BuildPublishablePool(
      *scan, {"node-1", "vfio.dra.io", ServerProfile{"v1", 34, false}}, maxima, &taints);
  ASSERT_TRUE(v134.valid.ok()) << v134.valid.error().message;
  EXPECT_EQ(slice_sizes(v134.pool), std::vector<size_t>{67});
  EXPECT_EQ(causes(v134.pool, "gpu-0000-01-00-0"),
            std::vector<std::string>{"vfio.dra.io/unhealthy NoSchedule"});
  EXPECT_TRUE(causes(v134.pool, "gpu-0000-01-02-0").empty());
  EXPECT_EQ(v134.pool.taint_reasons.count("gpu-0000-01-02-0"), 0u);
}

TEST(SliceBuilder, AnEmptyNodeStillPublishesOneEmptySlice) {
  FixtureNode node("iommu-off");
  Built built = Build(node, CounterLayout::kOwnSlice);
  ASSERT_EQ(built.pool.slices.size(), 1u);
  EXPECT_TRUE(built.pool.slices[0].devices.empty());
}

// A counter-aware allocator as the scheduler would run it: a device fits when every counter it
// consumes still has room.
class CounterAllocator {
 public:
  explicit CounterAllocator(const DesiredPool& pool) {
    for (const auto& slice : pool.slices) {
      for (const auto& set : slice.shared_counters) {
        for (const auto& [name, value] : set.counters) left_[set.name + "/" + name] = value;
      }
      for (const auto& device : slice.devices) devices_[device.name] = device;
    }
  }
  bool Allocate(const std::string& name) {
    const SliceDevice& device = devices_.at(name);
    for (const auto& c : device.consumes_counters) {
      for (const auto& [counter, amount] : c.counters) {
        if (left_[c.counter_set + "/" + counter] < amount) return false;
      }
    }
    for (const auto& c : device.consumes_counters) {
      for (const auto& [counter, amount] : c.counters) {
        left_[c.counter_set + "/" + counter] -= amount;
      }
    }
    return true;
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& [name, device] : devices_) out.push_back(name);
    return out;
  }

 private:
  std::map<std::string, int64_t> left_;
  std::map<std::string, SliceDevice> devices_;
};

TEST(CounterAllocatorTest, NeverTheWholeGpuWithAnInstanceNorMoreInstancesThanFit) {
  FixtureNode node("");
  vfio_dra::testing::SysfsFixture fx(node.sysfs_root());
  fx.AddPci(vfio_dra::testing::MakePciSpec("0000:3b:00.0", 0x10de, 0x1eb8, 0x030200, "nvidia", 40));
  fx.AddMdevParent("0000:3b:00.0", {{"nvidia-222", "GRID T4-1B", "", 16},
                                    {"nvidia-223", "GRID T4-2B", "", 8},
                                    {"nvidia-228", "GRID T4-8A", "", 2},
                                    {"nvidia-229", "GRID T4-16A", "", 1}});
  Built built = Build(node, CounterLayout::kOwnSlice);
  ASSERT_TRUE(
      ValidatePool(built.pool, {35, "vfio.dra.io", "node-1", CounterLayout::kOwnSlice}).ok());
  std::mt19937 rng(7);
  for (int round = 0; round < 500; ++round) {
    CounterAllocator allocator(built.pool);
    std::vector<std::string> names = allocator.Names();
    std::shuffle(names.begin(), names.end(), rng);
    bool whole = false;
    int instances = 0;
    int units = 0;  // in 1/16ths of the GPU
    for (const std::string& name : names) {
      if (!allocator.Allocate(name)) continue;
      if (name == "gpu-0000-3b-00-0") whole = true;
      if (name.rfind("mdev-", 0) == 0) {
        ++instances;
        units += name.find("nvidia-222") != std::string::npos   ? 1
                 : name.find("nvidia-223") != std::string::npos ? 2
                 : name.find("nvidia-228") != std::string::npos ? 8
                                                                : 16;
      }
    }
    ASSERT_FALSE(whole && instances > 0) << "round " << round;
    ASSERT_LE(units, 16) << "round " << round;
  }
}

TEST(SliceValidator, RejectsWhatTheServerWouldNamingDeviceAndRule) {
  auto pool_with = [](SliceContent slice) {
    DesiredPool pool;
    pool.name = "node-1";
    pool.slices.push_back(std::move(slice));
    return pool;
  };
  const ValidationTarget v135{35, "vfio.dra.io", "node-1", CounterLayout::kOwnSlice};
  SliceContent many;
  for (int i = 0; i < 129; ++i) many.devices.push_back({"d" + std::to_string(i), {}, {}});
  EXPECT_THAT(ValidatePool(pool_with(many), v135).error().message,
              HasSubstr("must have at most 128 items, has 129"));
  SliceContent bad_attr;
  bad_attr.devices.push_back({"gpu-1", {{"bad-name", std::string("x")}}, {}});
  EXPECT_THAT(ValidatePool(pool_with(bad_attr), v135).error().message,
              HasSubstr("device gpu-1: attribute name \"bad-name\""));
  SliceContent long_value;
  long_value.devices.push_back({"gpu-1", {{"productName", std::string(65, 'x')}}, {}});
  EXPECT_THAT(ValidatePool(pool_with(long_value), v135).error().message,
              HasSubstr("longer than 64"));
  SliceContent dangling;
  dangling.devices.push_back({"gpu-1", {}, {{"nope", {{"capacity", 1}}}}});
  EXPECT_THAT(ValidatePool(pool_with(dangling), v135).error().message,
              HasSubstr("consumes counter set nope, which is not in the pool"));
  SliceContent both;
  both.devices.push_back({"gpu-1", {}, {}});
  both.shared_counters.push_back({"set", {{"capacity", 1}}});
  EXPECT_THAT(ValidatePool(pool_with(both), v135).error().message,
              HasSubstr("only one of `sharedCounters` or `devices`"));
  EXPECT_TRUE(
      ValidatePool(pool_with(both), {34, "vfio.dra.io", "node-1", CounterLayout::kInDeviceSlice})
          .ok());
  SliceContent bad_name;
  bad_name.devices.push_back({"GPU_1", {}, {}});
  EXPECT_THAT(ValidatePool(pool_with(bad_name), v135).error().message, HasSubstr("DNS label"));
  SliceContent self_qualified;
  self_qualified.devices.push_back({"gpu-1", {{"vfio.dra.io/type", std::string("pci")}}, {}});
  EXPECT_THAT(ValidatePool(pool_with(self_qualified), v135).error().message,
              HasSubstr("device gpu-1: attribute name \"vfio.dra.io/type\" is qualified with the "
                        "driver's own domain vfio.dra.io; publish it as \"type\""));
  SliceContent two_slashes;
  two_slashes.devices.push_back({"gpu-1", {{"example.com/a/b", std::string("x")}}, {}});
  EXPECT_THAT(ValidatePool(pool_with(two_slashes), v135).error().message,
              HasSubstr("device gpu-1: attribute name \"example.com/a/b\" has more than one '/'"));
  // 1.38 caps semver numbers at 18 digits, digit-only pre-release identifiers included.
  const auto version_pool = [&](const std::string& version) {
    SliceContent slice;
    slice.devices.push_back({"gpu-1", {{"driverVersion", VersionString{version}}}, {}});
    return pool_with(slice);
  };
  for (const char* good : {"1.2.3", "1.2.3-rc.1+build.007", "123456789012345678.0.0",
                           "1.0.0-123456789012345678", "1.0.0-0a.1"}) {
    Status s = ValidatePool(version_pool(good), v135);
    EXPECT_TRUE(s.ok()) << good << ": " << s.error().message;
  }
  for (const char* bad : {"1234567890123456789.0.0", "1.0.0-1234567890123456789", "1.0.0-rc.01",
                          "01.0.0", "1.0", "1.0.0-", "1.0.0-a..b"}) {
    EXPECT_THAT(ValidatePool(version_pool(bad), v135).error().message,
                HasSubstr("attribute driverVersion is not a semantic version"))
        << bad;
  }
  EXPECT_TRUE(IsQualifiedName("resource.kubernetes.io/pciBusID"));
  EXPECT_FALSE(IsQualifiedName("a/b/c"));
  EXPECT_FALSE(IsQualifiedName("1abc"));
}

TEST(DeviceNames, AreDnsLabelsAndStable) {
  EXPECT_EQ(PciDeviceName(discovery::DeviceKind::kGpu, "0000:3b:00.0"), "gpu-0000-3b-00-0");
  EXPECT_EQ(PciDeviceName(discovery::DeviceKind::kVf, "0000:5e:02.3"), "vf-0000-5e-02-3");
  EXPECT_EQ(MdevDeviceName("0000:3b:00.0", "nvidia-222", 15), "mdev-0000-3b-00-0-nvidia-222-15");
  const std::string gvt = MdevDeviceName("0000:00:02.0", "i915-GVTg_V5_4", 0);
  EXPECT_TRUE(IsDnsLabel(gvt)) << gvt;
  EXPECT_NE(gvt, MdevDeviceName("0000:00:02.0", "i915-GVTg-V5-4", 0));
  const std::string long_type = MdevDeviceName("0000:00:02.0", std::string(80, 'a'), 123);
  EXPECT_LE(long_type.size(), 63u);
  EXPECT_TRUE(IsDnsLabel(long_type));
  const std::string uuid = MdevInstanceUuid("node-1", "0000:3b:00.0", "nvidia-222", 0);
  EXPECT_EQ(uuid, MdevInstanceUuid("node-1", "0000:3b:00.0", "nvidia-222", 0));
  EXPECT_NE(uuid, MdevInstanceUuid("node-2", "0000:3b:00.0", "nvidia-222", 0));
  EXPECT_EQ(uuid.size(), 36u);
  EXPECT_EQ(uuid[14], '5');  // version 5
  // Published names and UUIDs must not change across releases; both values are Python's
  // (uuid.uuid5 in the vfio-dra namespace, and hashlib.sha1 for the label's hash suffix).
  EXPECT_EQ(uuid, "605865aa-d313-555f-8268-0830f36fcc96");
  EXPECT_EQ(gvt, "mdev-0000-00-02-0-i915-gvtg-v5-4-e4a11996-0");
}

TEST(Quantity, ParsesCanonicalForms) {
  EXPECT_EQ(*ParseIntegerQuantity("24"), 24);
  EXPECT_EQ(*ParseIntegerQuantity("1k"), 1000);
  EXPECT_EQ(*ParseIntegerQuantity("2Ki"), 2048);
  EXPECT_EQ(*ParseIntegerQuantity("1e3"), 1000);
  EXPECT_FALSE(ParseIntegerQuantity("1.5").ok());
  EXPECT_FALSE(ParseIntegerQuantity("k").ok());
  EXPECT_FALSE(ParseIntegerQuantity("99999999999999999999").ok());
}

// The reconciler keeps only digests of the server's slices: the server's echo of a slice must
// digest equal to what was sent, in every API version, and any change must not.
TEST(SliceDigest, MatchesTheServerEchoAndChangesWithTheContent) {
  FixtureNode node("vgpu");
  const Built built = Build(node, CounterLayout::kInDeviceSlice);
  ASSERT_FALSE(built.pool.slices.empty());
  const SliceContent& sent = built.pool.slices.front();
  ASSERT_FALSE(sent.devices.empty());
  ASSERT_FALSE(sent.shared_counters.empty());
  const SliceDigest digest = DigestOf(sent);
  for (const std::string version : {"v1", "v1beta2", "v1beta1"}) {
    SliceMeta meta;
    meta.api_version = version;
    meta.name = "node-1-vfio-dra-abcde";
    auto echo = SliceContentFromJson(SliceToJson(sent, meta));
    ASSERT_TRUE(echo.ok()) << version;
    EXPECT_EQ(DigestOf(*echo), digest) << version;
  }

  SliceContent value_changed = sent;
  value_changed.devices.front().attributes["resource.kubernetes.io/pciBusID"] =
      std::string("0000:ff:00.0");
  EXPECT_EQ(DigestOf(value_changed).names, digest.names);
  EXPECT_NE(DigestOf(value_changed).content, digest.content);

  SliceContent counter_changed = sent;
  counter_changed.shared_counters.front().counters.begin()->second += 1;
  EXPECT_EQ(DigestOf(counter_changed).names, digest.names);
  EXPECT_NE(DigestOf(counter_changed).content, digest.content);

  // The attribute's type counts, not only how its value prints.
  SliceContent as_int = sent;
  SliceContent as_bool = sent;
  SliceContent as_string = sent;
  as_int.devices.front().attributes["x"] = int64_t{1};
  as_bool.devices.front().attributes["x"] = true;
  as_string.devices.front().attributes["x"] = std::string("1");
  EXPECT_NE(DigestOf(as_int).content, DigestOf(as_bool).content);
  EXPECT_NE(DigestOf(as_int).content, DigestOf(as_string).content);
  EXPECT_NE(DigestOf(as_bool).content, DigestOf(as_string).content);

  SliceContent renamed = sent;
  renamed.devices.front().name += "-x";
  EXPECT_NE(DigestOf(renamed).names, digest.names);

  SliceContent reordered = sent;
  std::reverse(reordered.devices.begin(), reordered.devices.end());
  EXPECT_EQ(DigestOf(reordered).names, digest.names);      // matched to the same slice
  EXPECT_NE(DigestOf(reordered).content, digest.content);  // but rewritten, as order is content

  SliceContent consumption_changed = sent;
  SliceDevice* consumer = nullptr;
  for (auto& device : consumption_changed.devices) {
    if (!device.consumes_counters.empty()) consumer = &device;
  }
  ASSERT_NE(consumer, nullptr);
  consumer->consumes_counters.front().counters.begin()->second += 1;
  EXPECT_EQ(DigestOf(consumption_changed).names, digest.names);
  EXPECT_NE(DigestOf(consumption_changed).content, digest.content);
}

}  // namespace
}  // namespace vfio_dra::slicepublisher
