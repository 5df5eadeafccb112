// The vGPU counter model on nodes that already run instances: the maxima's sources, what is
// learned and kept across restarts, and that every type the kernel can create stays allocatable.
#include "slicepublisher/mdev_counters.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "simulated_kernel.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/device_names.h"
#include "slicepublisher/mdev_type_maxima.h"
#include "slicepublisher/server_profile.h"
#include "slicepublisher/slice_builder.h"
#include "slicepublisher/slice_validator.h"
#include "sysfs/sysfs_parse.h"
#include "unit/fixture_node.h"

namespace vfio_dra::slicepublisher {
namespace {

using ::testing::HasSubstr;
using vfio_dra::testing::FixtureNode;
namespace fs = std::filesystem;

std::shared_ptr<const discovery::NodeScan> ScanOf(const FixtureNode& node,
                                                  const discovery::AdminPolicy& policy = {}) {
  sysfs::SysfsReader sysfs(node.sysfs_root());
  auto names = discovery::PciNames::Open({node.sysfs_root(), node.pci_ids(), false});
  return discovery::ScanNode(sysfs, names.ok() ? names->get() : nullptr, policy);
}

const discovery::MdevParent& ParentOf(const discovery::Inventory& inventory,
                                      const std::string& name) {
  for (const auto& parent : inventory.mdev_parents) {
    if (parent.name == name) return parent;
  }
  throw std::runtime_error("no mdev parent " + name);
}

// What a parent's counter set offers the scheduler, read back from the published pool.
struct Offer {
  int64_t capacity = -1;
  int64_t whole = -1;                       // what the whole device consumes; -1: not published
  std::map<std::string, int> potentials;    // per type: potential instances published
  std::map<std::string, int64_t> consumes;  // per type: what one of them consumes
};

Offer OfferOf(const DesiredPool& pool, const std::string& counter_set) {
  Offer offer;
  for (const auto& slice : pool.slices) {
    for (const auto& set : slice.shared_counters) {
      if (set.name == counter_set) offer.capacity = set.counters.at(kCapacityCounter);
    }
    for (const auto& device : slice.devices) {
      if (device.consumes_counters.empty() ||
          device.consumes_counters[0].counter_set != counter_set) {
        continue;
      }
      const int64_t consumes = device.consumes_counters[0].counters.at(kCapacityCounter);
      const PublishedDeviceView view = DecodePublishedDevice(device);
      if (!view.IsMdev()) {
        offer.whole = consumes;
        continue;
      }
      ++offer.potentials[*view.mdev_type];
      offer.consumes[*view.mdev_type] = consumes;
    }
  }
  return offer;
}

// The property the scheduler needs: every type the kernel can still create can be allocated
// as often as the kernel allows, and the whole device never fits beside an instance.
void ExpectEverythingTheKernelOffersFits(const discovery::NodeScan& scan, const DesiredPool& pool) {
  for (const auto& parent : scan.inventory.mdev_parents) {
    const std::string set = CounterSetName(parent.name, !parent.pci_address.empty());
    const Offer offer = OfferOf(pool, set);
    ASSERT_GE(offer.capacity, 0) << set;
    for (const auto& type : parent.types) {
      if (type.available_instances == 0) {
        EXPECT_EQ(offer.potentials.count(type.id), 0u) << set << " " << type.id;
        continue;
      }
      EXPECT_EQ(offer.potentials.at(type.id), type.available_instances) << set << " " << type.id;
      EXPECT_LE(offer.consumes.at(type.id) * type.available_instances, offer.capacity)
          << set << " " << type.id;
    }
    if (offer.whole >= 0 && !parent.instances.empty()) {
      EXPECT_GT(offer.whole, offer.capacity) << set;
    }
  }
}

TEST(MdevMaxInstance, ReadsNvidiasStatementOnly) {
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("num_heads=4, frl_config=45, framebuffer=2048M, "
                                        "max_resolution=5120x2880, max_instance=12"),
            12);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("max_instance=3, num_heads=1"), 3);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("max_instance=24\n"), 24);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance(""), std::nullopt);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("low_gm_size: 128MB\nweight: 4\n"), std::nullopt);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("vmax_instance=3"), std::nullopt);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("max_instance=0"), std::nullopt);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("max_instance=x"), std::nullopt);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("max_instance=12x"), std::nullopt);
  EXPECT_EQ(sysfs::ParseMdevMaxInstance("max_instance=99999999"), std::nullopt);
}

TEST(MdevTypeMaxima, TheVendorsStatementWinsOnAFreshStart) {
  FixtureNode node("vgpu-busy");
  auto scan = ScanOf(node);
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  const TypeMaximum one_b = maxima.Max("0000:3b:00.0", "nvidia-222");
  EXPECT_EQ(one_b.value, 16);
  EXPECT_EQ(one_b.source, MaximumSource::kVendor);
  EXPECT_EQ(maxima.Max("0000:3b:00.0", "nvidia-228").value, 2);
  EXPECT_EQ(maxima.Max("0000:3c:00.0", "nvidia-229").value, 1);
  // mtty states nothing: available + existing, a lower bound.
  const TypeMaximum mtty_1 = maxima.Max("mtty", "mtty-1");
  EXPECT_EQ(mtty_1.value, 20);
  EXPECT_EQ(mtty_1.source, MaximumSource::kAvailablePlusUsed);
  EXPECT_FALSE(mtty_1.Exact());
  EXPECT_EQ(maxima.Max("mtty", "mtty-2").value, 11);
  EXPECT_EQ(maxima.Max("mtty", "nope").source, MaximumSource::kNone);
}

TEST(MdevTypeMaxima, AnEmptyParentStatesItsMaximaAndTheyAreKeptAcrossASaveAndLoad) {
  FixtureNode node("mtty");
  MdevTypeMaxima maxima;
  EXPECT_TRUE(maxima.Observe(ScanOf(node)->inventory));
  EXPECT_FALSE(maxima.Observe(ScanOf(node)->inventory));  // nothing new: nothing to save
  EXPECT_EQ(maxima.Max("mtty", "mtty-1").value, 24);
  EXPECT_EQ(maxima.Max("mtty", "mtty-1").source, MaximumSource::kSeenEmpty);
  const std::string path = node.dir() + "/" + kMdevTypeMaximaFile;
  ASSERT_TRUE(maxima.Save(path).ok());
  auto loaded = MdevTypeMaxima::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->ToJson(), maxima.ToJson());
  EXPECT_EQ(loaded->ToJson()["version"], kMdevTypeMaximaVersion);
}

TEST(MdevTypeMaxima, ALearnedValueBelongsToTheParentsModel) {
  FixtureNode node("vgpu-busy");
  auto scan = ScanOf(node);
  nlohmann::json learned = {
      {"kind", "MdevTypeMaxima"},
      {"version", 1},
      {"parents",
       {{"mtty", {{"model", ""}, {"types", {{"mtty-1", {{"max", 24}, {"seenEmpty", true}}}}}}},
        {"0000:3c:00.0",
         {{"model", "10de:2236"},  // another GPU was in this slot
          {"types", {{"nvidia-223", {{"max", 99}, {"seenEmpty", true}}}}}}}}}};
  auto maxima = MdevTypeMaxima::FromJson(learned, "test");
  ASSERT_TRUE(maxima.ok()) << maxima.error().message;
  maxima->Observe(scan->inventory);
  EXPECT_EQ(maxima->Max("mtty", "mtty-1").value, 24);
  EXPECT_EQ(maxima->Max("mtty", "mtty-1").source, MaximumSource::kSeenEmpty);
  EXPECT_EQ(maxima->Max("0000:3c:00.0", "nvidia-223").value, 8);  // the vendor's, not 99
  EXPECT_EQ(maxima->ToJson()["parents"]["0000:3c:00.0"]["model"], "10de:1eb8");
}

TEST(MdevTypeMaxima, BadFilesAreErrorsThatNameThemAndAMissingOneIsEmpty) {
  FixtureNode node("");
  const std::string path = node.dir() + "/maxima.json";
  auto missing = MdevTypeMaxima::Load(path);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->ToJson()["parents"].size(), 0u);
  for (const auto& [text, problem] : std::map<std::string, std::string>{
           {"{", "not valid JSON"},
           {R"({"kind":"MdevTypeMaxima","version":7,"parents":{}})", "unknown version"},
           {R"({"kind":"Other","version":1,"parents":{}})", "not an MdevTypeMaxima"},
           {R"({"kind":"MdevTypeMaxima","version":1,"parents":{"p":{"model":"","types":)"
            R"({"t":{"max":-3,"seenEmpty":true}}}}})",
            "parents.p.types.t.max: -3 is out of range"}}) {
    std::ofstream(path, std::ios::trunc) << text;
    auto loaded = MdevTypeMaxima::Load(path);
    ASSERT_FALSE(loaded.ok()) << text;
    EXPECT_THAT(loaded.error().message, HasSubstr(path)) << text;
    EXPECT_THAT(loaded.error().message, HasSubstr(problem)) << text;
  }
}

TEST(MdevCounters, TheIssuesT4ExampleKeepsItsWholeCapacity) {
  // One 4-instance-type vGPU runs; the kernel reports 12, 6, 3, 1, 0 available. The maxima come
  // from the vendor (16/8/4/2/1), so 12 of 16 units are free: 12 of the smallest type fit and
  // the 2-instance type can be placed.
  FixtureNode node("vgpu-busy");
  auto scan = ScanOf(node);
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  const MdevCounterPlan plan = PlanMdevCounters(ParentOf(scan->inventory, "0000:3b:00.0"), maxima);
  EXPECT_FALSE(plan.availability_model);
  EXPECT_EQ(plan.capacity, 12);
  EXPECT_EQ(plan.whole_consumes, 16);
  EXPECT_EQ(plan.types.at("nvidia-222").consumes, 1);
  EXPECT_EQ(plan.types.at("nvidia-222").offerable, 12);
  EXPECT_EQ(plan.types.at("nvidia-228").consumes, 8);
  EXPECT_EQ(plan.types.at("nvidia-228").offerable, 1);
  EXPECT_EQ(plan.types.at("nvidia-229").offerable, 0);
}

TEST(MdevCounters, AOneTypeParentOffersOnlyTheTypeInUse) {
  FixtureNode node("vgpu-busy");
  auto scan = ScanOf(node);
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  const DesiredPool pool = BuildDesiredPool(*scan, {"node-1", CounterLayout::kOwnSlice}, maxima);
  const Offer offer = OfferOf(pool, "gpu-0000-3c-00-0");
  EXPECT_EQ(offer.potentials, (std::map<std::string, int>{{"nvidia-223", 6}}));
  EXPECT_EQ(offer.capacity, 12);
  EXPECT_EQ(offer.whole, 16);
}

// Before the first instance exists, a one-type parent offers every type; the admin closes that
// window by pinning a type per parent (the line a refused prepare suggests) or per GPU model.
TEST(MdevCounters, APolicyPinOffersOnlyThePinnedTypeBeforeAnyInstanceExists) {
  FixtureNode node("vm-host");
  MdevTypeMaxima maxima;
  {
    auto scan = ScanOf(node);
    maxima.Observe(scan->inventory);
    const Offer open = OfferOf(
        BuildDesiredPool(*scan, {"node-1", CounterLayout::kOwnSlice}, maxima), "gpu-0000-3b-00-0");
    EXPECT_EQ(open.potentials, (std::map<std::string, int>{{"nvidia-222", 16}, {"nvidia-223", 8}}));
  }
  for (const std::string pin :
       {R"(select: [{kind: mdev, address: "0000:3b:00.0", mdevType: "nvidia-223"}])",
        R"(select: [{kind: mdev, vendor: "10de", device: "1eb8", mdevType: "nvidia-223"}])"}) {
    SCOPED_TRACE(pin);
    auto policy = discovery::ParseAdminPolicy("version: v1\n" + pin + "\n", "policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.error().message;
    auto scan = ScanOf(node, *policy);
    maxima.Observe(scan->inventory);
    const DesiredPool pool = BuildDesiredPool(*scan, {"node-1", CounterLayout::kOwnSlice}, maxima);
    const Offer offer = OfferOf(pool, "gpu-0000-3b-00-0");
    EXPECT_EQ(offer.potentials, (std::map<std::string, int>{{"nvidia-223", 8}}));
    EXPECT_EQ(offer.consumes.at("nvidia-223") * 8, offer.capacity);
    EXPECT_EQ(offer.whole, offer.capacity);
  }
}

TEST(MdevCounters, LowerBoundsThatContradictTheKernelFallBackToItsCounts) {
  // mtty after a fresh start with 1 single-port and 2 dual-port instances: maxima 20 and 11
  // (lower bounds) would leave 169 of 220 units, not enough for the 19 single ports the kernel
  // can still create. Counted in the kernel's own numbers instead: lcm(19, 9) = 171.
  FixtureNode node("vgpu-busy");
  auto scan = ScanOf(node);
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  const MdevCounterPlan plan = PlanMdevCounters(ParentOf(scan->inventory, "mtty"), maxima);
  EXPECT_TRUE(plan.availability_model);
  EXPECT_EQ(plan.capacity, 171);
  EXPECT_EQ(plan.types.at("mtty-1").consumes, 9);
  EXPECT_EQ(plan.types.at("mtty-2").consumes, 19);
  EXPECT_GT(plan.whole_consumes, plan.capacity);
}

TEST(MdevCounters, EverythingTheKernelOffersIsAllocatableOnABusyNodeForEachRelease) {
  FixtureNode node("vgpu-busy");
  auto scan = ScanOf(node);
  MdevTypeMaxima maxima;
  maxima.Observe(scan->inventory);
  for (int minor : {34, 35, 36}) {
    SCOPED_TRACE("1." + std::to_string(minor));
    const ServerProfile profile{"v1", minor, false};
    const DesiredPool pool = BuildDesiredPool(*scan, {"node-1", profile.Layout()}, maxima);
    Status valid = ValidatePool(pool, {minor, "vfio.dra.io", "node-1", profile.Layout()});
    EXPECT_TRUE(valid.ok()) << valid.error().message;
    ExpectEverythingTheKernelOffersFits(*scan, pool);
  }
}

// The daemon that created the instances saw the parents empty; a restart (the next instance of
// a rolling update) reads what it learned and publishes the same counters.
TEST(MdevCounters, ARestartPublishesWhatTheDaemonThatCreatedTheInstancesPublished) {
  for (const std::string fixture : {"mtty", "vm-host"}) {
    SCOPED_TRACE(fixture);
    FixtureNode node(fixture);
    vfio_dra::testing::SimulatedKernel kernel(node.sysfs_root(), node.dir() + "/dev");
    MdevTypeMaxima first;
    first.Observe(ScanOf(node)->inventory);
    // Instances of the types the parent allows together (mtty: both; the T4: one).
    const std::string parent = fixture == "mtty" ? "mtty" : "0000:3b:00.0";
    const std::vector<std::string> types =
        fixture == "mtty" ? std::vector<std::string>{"mtty-1", "mtty-2", "mtty-2"}
                          : std::vector<std::string>{"nvidia-223", "nvidia-223"};
    int n = 0;
    for (const std::string& type : types) {
      const std::string uuid = "5d6e7f80-0000-4000-8000-00000000000" + std::to_string(++n);
      ASSERT_EQ(kernel.Write(node.sysfs_root() + "/class/mdev_bus/" + parent +
                                 "/mdev_supported_types/" + type + "/create",
                             uuid),
                0);
    }
    auto busy = ScanOf(node);
    first.Observe(busy->inventory);
    const std::string path = node.dir() + "/" + kMdevTypeMaximaFile;
    ASSERT_TRUE(first.Save(path).ok());
    const DesiredPool before = BuildDesiredPool(*busy, {"node-1", CounterLayout::kOwnSlice}, first);
    ExpectEverythingTheKernelOffersFits(*busy, before);

    auto restarted = MdevTypeMaxima::Load(path);
    ASSERT_TRUE(restarted.ok()) << restarted.error().message;
    restarted->Observe(busy->inventory);
    const DesiredPool after =
        BuildDesiredPool(*busy, {"node-1", CounterLayout::kOwnSlice}, *restarted);
    EXPECT_EQ(after.slices, before.slices);
    EXPECT_FALSE(
        PlanMdevCounters(ParentOf(busy->inventory, parent), *restarted).availability_model);
  }
}

}  // namespace
}  // namespace vfio_dra::slicepublisher
