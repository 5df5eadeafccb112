// NVIDIA vGPU on SR-IOV VFs from sysfs to slices: parsing creatable_vgpu_types, discovery of the
// VFs, the policy's switch and type pins, the published devices and their counters (checked by
// the slice validator in every layout), and what `discover` says about each VF, on the
// simulated kernel as vGPUs come and go.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "discovery/admin_policy.h"
#include "discovery/discover_report.h"
#include "discovery/node_scan.h"
#include "discovery/vgpu_gpu_sizes_file.h"
#include "discovery/vgpu_selection.h"
#include "prepare/prepare_checkpoint.h"
#include "simulated_kernel.h"
#include "slicepublisher/device_attributes.h"
#include "slicepublisher/slice_builder.h"
#include "slicepublisher/slice_validator.h"
#include "sysfs/sysfs_parse.h"
#include "unit/fixture_node.h"
#include "vfio/device_lock_gate.h"
#include "vfio/vgpu_vf_lifecycle.h"

namespace vfio_dra::testing {
namespace {

using slicepublisher::CounterLayout;
using slicepublisher::DesiredPool;
using slicepublisher::SliceDevice;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CreatableVgpuTypes, ParsesTheDriversFormat) {
  auto types = sysfs::ParseCreatableVgpuTypes(
      "ID    : vGPU Name\n1414  : NVIDIA H200X-1-18C\n25    : NVIDIA H100-80C\n");
  ASSERT_TRUE(types.ok()) << types.error().message;
  EXPECT_THAT(*types, ElementsAre(sysfs::CreatableVgpuType{1414, "NVIDIA H200X-1-18C"},
                                  sysfs::CreatableVgpuType{25, "NVIDIA H100-80C"}));
  auto full = sysfs::ParseCreatableVgpuTypes("ID    : vGPU Name\n");
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(full->empty());
  EXPECT_FALSE(sysfs::ParseCreatableVgpuTypes("1414  : NVIDIA H100-20C\n").ok());  // no header
  EXPECT_FALSE(sysfs::ParseCreatableVgpuTypes("ID    : vGPU Name\nabc : x\n").ok());
  EXPECT_FALSE(sysfs::ParseCreatableVgpuTypes("ID    : vGPU Name\n0     : x\n").ok());
  EXPECT_FALSE(sysfs::ParseCreatableVgpuTypes("ID    : vGPU Name\n12    :\n").ok());
}

TEST(VgpuVfPolicy, TheKindCanBeTurnedOffAndTypesPinnedOnlyForIt) {
  auto off = discovery::ParseAdminPolicy("kinds: {vgpu: false}\n", "p.yaml");
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_FALSE(off->vgpu_enabled);
  auto pin = discovery::ParseAdminPolicy(
      "select:\n  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"1414\"}\n", "p.yaml");
  ASSERT_TRUE(pin.ok()) << pin.error().message;
  auto wrong =
      discovery::ParseAdminPolicy("select:\n  - {kind: mdev, vgpuType: \"1414\"}\n", "p.yaml");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.error().message, HasSubstr("only applies to kind vgpu"));
}

class VgpuVfNode : public ::testing::Test {
 protected:
  void SetUp() override { node_ = std::make_unique<FixtureNode>("vgpu-vf"); }
  std::shared_ptr<const discovery::NodeScan> Scan(const std::string& policy_yaml = "") const {
    sysfs::SysfsReader sysfs(node_->sysfs_root());
    auto policy = discovery::ParseAdminPolicy(policy_yaml, "policy.yaml");
    EXPECT_TRUE(policy.ok()) << policy.error().message;
    return discovery::ScanNode(sysfs, nullptr, *policy);
  }
  static DesiredPool Build(const discovery::NodeScan& scan, CounterLayout layout) {
    slicepublisher::MdevTypeMaxima maxima;
    DesiredPool pool = slicepublisher::BuildDesiredPool(scan, {"node-1", layout}, maxima);
    const int minor = layout == CounterLayout::kOwnSlice ? 35 : 34;
    Status valid = slicepublisher::ValidatePool(pool, {minor, "vfio.dra.io", "node-1", layout});
    EXPECT_TRUE(valid.ok()) << valid.error().message;
    return pool;
  }
  static std::map<std::string, SliceDevice> Devices(const DesiredPool& pool) {
    std::map<std::string, SliceDevice> out;
    for (const auto& slice : pool.slices) {
      for (const auto& device : slice.devices) out[device.name] = device;
    }
    return out;
  }
  static std::vector<std::string> Names(const DesiredPool& pool) {
    std::vector<std::string> names;
    for (const auto& [name, device] : Devices(pool)) names.push_back(name);
    return names;
  }
  int SetType(SimulatedKernel& kernel, const std::string& vf, int type) const {
    return kernel.Write(
        node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type",
        std::to_string(type));
  }
  std::unique_ptr<FixtureNode> node_;
};

TEST_F(VgpuVfNode, DiscoveryReadsEachVfsCurrentAndCreatableTypes) {
  auto scan = Scan();
  const discovery::PciFunction* idle = scan->inventory.Find("0000:41:00.4");
  ASSERT_NE(idle, nullptr);
  ASSERT_TRUE(idle->vgpu_vf.has_value());
  EXPECT_EQ(idle->vgpu_vf->current_type, 0);
  EXPECT_EQ(idle->vgpu_vf->creatable.size(), 3u);
  const discovery::PciFunction* busy = scan->inventory.Find("0000:c1:00.4");
  ASSERT_TRUE(busy && busy->vgpu_vf);
  EXPECT_EQ(busy->vgpu_vf->current_type, 1415);
  EXPECT_TRUE(busy->vgpu_vf->creatable.empty());
  EXPECT_FALSE(scan->inventory.Find("0000:41:00.0")->vgpu_vf.has_value());
  // The PFs are not published whole: their VFs are enabled.
  EXPECT_FALSE(scan->selection.functions.at("0000:41:00.0").published);
  EXPECT_TRUE(scan->selection.devices.empty());
  // The idle GPU has several types and nothing chosen; the busy one runs 40C, but this scan has
  // never seen it idle, so nothing bounds how many more it holds: only its vGPU is published.
  ASSERT_EQ(scan->selection.vgpu_vfs.size(), 1u);
  ASSERT_EQ(scan->selection.vgpu_gpus.size(), 2u);
  EXPECT_EQ(scan->selection.vgpu_gpus[0].type_id, 0);
  EXPECT_EQ(scan->selection.vgpu_gpus[1].type_id, 0);
}

// A pin for the idle GPU and an on-demand layout for the busy one.
constexpr const char* kPinAndLayout =
    "select:\n"
    "  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"NVIDIA H100-20C\"}\n"
    "vgpuLayouts:\n"
    "  - {match: {address: \"0000:c1:00.0\"}, vgpuType: \"1415\", count: 2, create: onDemand}\n";

TEST_F(VgpuVfNode, SlicesOfferOneTypePerGpuBoundedByAGpuCounterSet) {
  auto scan = Scan(kPinAndLayout);
  for (CounterLayout layout : {CounterLayout::kInDeviceSlice, CounterLayout::kOwnSlice}) {
    const DesiredPool pool = Build(*scan, layout);
    const auto devices = Devices(pool);
    // 4 idle VFs x 20C; the held 40C and the one more the layout's count leaves room for.
    EXPECT_THAT(Names(pool), ElementsAre("vgpu-0000-41-00-4-1414", "vgpu-0000-41-00-5-1414",
                                         "vgpu-0000-41-00-6-1414", "vgpu-0000-41-00-7-1414",
                                         "vgpu-0000-c1-00-4-1415", "vgpu-0000-c1-00-5-1415"));
    const SliceDevice& offered = devices.at("vgpu-0000-41-00-4-1414");
    const auto view = slicepublisher::DecodePublishedDevice(offered);
    EXPECT_TRUE(view.IsVgpu());
    EXPECT_EQ(view.pci_bus_id, "0000:41:00.4");
    EXPECT_EQ(view.vgpu_type_id, 1414);
    EXPECT_EQ(view.parent_pci_address, "0000:41:00.0");
    EXPECT_EQ(std::get<std::string>(offered.attributes.at("vgpuTypeName")), "NVIDIA H100-20C");
    EXPECT_EQ(std::get<std::string>(offered.attributes.at("resource.kubernetes.io/pcieRoot")),
              "pci0000:40");
    EXPECT_EQ(std::get<int64_t>(offered.attributes.at("resource.kubernetes.io/numaNode")), 0);
    ASSERT_EQ(offered.consumes_counters.size(), 1u);
    EXPECT_EQ(offered.consumes_counters[0].counter_set, "vgpu-gpu-0000-41-00-0");
    EXPECT_EQ(offered.consumes_counters[0].counters.at("capacity"), 1);
    std::map<std::string, int64_t> sets;
    for (const auto& slice : pool.slices) {
      for (const auto& set : slice.shared_counters) sets[set.name] = set.counters.at("capacity");
    }
    // 20C: 80 GB / 20 GB = 4 on the idle GPU; the layout's count on the busy one.
    EXPECT_THAT(sets,
                ElementsAre(std::pair<const std::string, int64_t>("vgpu-gpu-0000-41-00-0", 4),
                            std::pair<const std::string, int64_t>("vgpu-gpu-0000-c1-00-0", 2)));
    // The held vGPU consumes from its GPU's set like an offered one.
    const SliceDevice& held = devices.at("vgpu-0000-c1-00-4-1415");
    ASSERT_EQ(held.consumes_counters.size(), 1u);
    EXPECT_EQ(held.consumes_counters[0].counter_set, "vgpu-gpu-0000-c1-00-0");
    EXPECT_EQ(std::get<std::string>(held.attributes.at("vgpuTypeName")), "NVIDIA H100-40C");
    EXPECT_EQ(devices.count("gpu-0000-41-00-0"), 0u);  // never the whole PF with VFs on
  }
  // Without counters nothing would bound a GPU: only the held vGPU.
  EXPECT_THAT(Names(Build(*scan, CounterLayout::kNone)), ElementsAre("vgpu-0000-c1-00-4-1415"));
}

// As vGPUs come to exist, what each device consumes stays the same; the GPU's count is what the
// driver allows, and the largest type, no longer listed, is remembered from the idle scan.
TEST_F(VgpuVfNode, AsVgpusOfThePinnedTypeAreCreatedTheirConsumptionStaysAndTheCountHolds) {
  SimulatedKernel kernel(node_->sysfs_root(), node_->dir() + "/dev");
  const std::string pin = "select:\n  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"1415\"}\n";
  sysfs::SysfsReader sysfs(node_->sysfs_root());
  auto policy = discovery::ParseAdminPolicy(pin, "policy.yaml");
  ASSERT_TRUE(policy.ok());
  auto idle = discovery::ScanNode(sysfs, nullptr, *policy);
  EXPECT_EQ(
      idle->vgpu_sizes.at("0000:41:00.0"),
      (discovery::VgpuGpuSize{
          "10de:2331",
          80,
          "NVIDIA H100-80C",
          {{1414, "NVIDIA H100-20C"}, {1415, "NVIDIA H100-40C"}, {1416, "NVIDIA H100-80C"}}}));
  auto on_gpu = [](const DesiredPool& pool) {
    std::map<std::string, SliceDevice> out;
    for (const auto& [name, device] : Devices(pool)) {
      if (name.rfind("vgpu-0000-41", 0) == 0) out[name] = device;
    }
    return out;
  };
  const auto before = on_gpu(Build(*idle, CounterLayout::kOwnSlice));
  // 40C: 2 of them fit, offered on the first two free VFs.
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(SetType(kernel, "0000:41:00.4", 1415), 0);
  discovery::ScanContext context;
  context.vgpu_sizes = idle->vgpu_sizes;
  auto one = discovery::ScanNode(sysfs, nullptr, *policy, context);
  const auto during = on_gpu(Build(*one, CounterLayout::kOwnSlice));
  ASSERT_EQ(SetType(kernel, "0000:41:00.5", 1415), 0);
  auto full = discovery::ScanNode(sysfs, nullptr, *policy, context);
  const auto after = on_gpu(Build(*full, CounterLayout::kOwnSlice));
  for (const auto* devices : {&during, &after}) {
    ASSERT_EQ(devices->size(), 2u);
    for (const auto& [name, device] : before) {
      ASSERT_EQ(devices->count(name), 1u) << name;
      EXPECT_EQ(devices->at(name).consumes_counters, device.consumes_counters) << name;
    }
  }
  EXPECT_THAT(full->selection.functions.at("0000:41:00.6").reason,
              HasSubstr("can take 1415 (NVIDIA H100-40C) no more now"));
  EXPECT_FALSE(full->selection.functions.at("0000:41:00.6").published);
  // Without the remembered size the running GPU has no bound: nothing new, and why.
  auto forgot = discovery::ScanNode(sysfs, nullptr, *policy);
  EXPECT_THAT(forgot->selection.vgpu_gpus[0].state, HasSubstr("has not seen it idle"));
}

TEST_F(VgpuVfNode, ThePolicyTurnsTheKindOffOrPinsTypes) {
  auto off = Scan("kinds: {vgpu: false}\n");
  EXPECT_TRUE(off->selection.vgpu_vfs.empty());
  EXPECT_THAT(off->selection.functions.at("0000:41:00.4").reason,
              HasSubstr("kind vgpu is turned off"));
  auto pinned = Scan(
      "select:\n  - {kind: vgpu, pf: \"0000:41:00.0\", vgpuType: \"NVIDIA H100-20C\"}\n"
      "  - {kind: vgpu, pf: \"0000:c1:00.0\", vgpuType: \"1415\"}\n");
  EXPECT_THAT(
      Names(Build(*pinned, CounterLayout::kOwnSlice)),
      ElementsAre("vgpu-0000-41-00-4-1414", "vgpu-0000-41-00-5-1414", "vgpu-0000-41-00-6-1414",
                  "vgpu-0000-41-00-7-1414", "vgpu-0000-c1-00-4-1415"));
  EXPECT_THAT(pinned->selection.functions.at("0000:41:00.4").reason,
              HasSubstr("offered 1414 (NVIDIA H100-20C); the GPU offers 1414 (NVIDIA H100-20C) "
                        "created at prepare, at most 4 on it (frame buffer: 20 GB of the GPU's 80 "
                        "GB (NVIDIA H100-80C), capped at its VF count)"));
  auto other = Scan("select:\n  - {kind: vgpu, vgpuType: \"9999\"}\n");
  EXPECT_THAT(other->selection.functions.at("0000:41:00.4").reason,
              HasSubstr("no vgpu selector of the policy matches a type its VFs list"));
}

TEST_F(VgpuVfNode, DiscoverExplainsEachVfAndEachGpu) {
  auto scan = Scan();
  const std::string table = discovery::DiscoverTable(scan->inventory, scan->selection, {});
  EXPECT_THAT(table, HasSubstr("vgpu: vGPU VF of 0000:c1:00.0: holds vGPU 1415 (NVIDIA H100-40C), "
                               "published as it is; never offered another type"));
  EXPECT_THAT(table, HasSubstr("- vGPU VF of 0000:41:00.0: holds no vGPU; nothing offered: idle, "
                               "with several types (1414 (NVIDIA H100-20C), 1415 (NVIDIA "
                               "H100-40C), 1416 (NVIDIA H100-80C)) and none chosen"));
  EXPECT_THAT(table, HasSubstr("GPUs with vGPU VFs"));
  EXPECT_THAT(table, HasSubstr("1 vGPU VF"));
  const nlohmann::json json = discovery::DiscoverJson(scan->inventory, scan->selection, {});
  ASSERT_EQ(json["vgpuGpus"].size(), 2u);
  EXPECT_EQ(json["vgpuGpus"][0]["pf"], "0000:41:00.0");
  EXPECT_FALSE(json["vgpuGpus"][0].contains("offeredType"));
  auto pinned = Scan(kPinAndLayout);
  const nlohmann::json with = discovery::DiscoverJson(pinned->inventory, pinned->selection, {});
  EXPECT_EQ(with["vgpuGpus"][1]["offeredType"]["id"], 1415);
  EXPECT_EQ(with["vgpuGpus"][1]["bound"], 2);
  EXPECT_EQ(with["vgpuGpus"][1]["boundSource"], "vgpuLayouts[0].count");
  for (const auto& fn : with["functions"]) {
    if (fn["address"] != "0000:c1:00.5") continue;
    EXPECT_EQ(fn["vgpuVf"]["currentType"], 0);
    EXPECT_EQ(fn["vgpuVf"]["offered"], nlohmann::json::array({1415}));
  }
}

// #53 item 2: a denied vGPU type is not offered, and an existing vGPU of it is not published.
TEST_F(VgpuVfNode, ADeniedTypeIsNeitherOfferedNorPublished) {
  auto scan = Scan(
      "select:\n  - {kind: vgpu, vgpuType: [\"1414\", \"1415\"]}\n"
      "deny:\n  - {kind: vgpu, vgpuType: \"NVIDIA H100-40C\"}\n");
  EXPECT_THAT(Names(Build(*scan, CounterLayout::kOwnSlice)),
              ElementsAre("vgpu-0000-41-00-4-1414", "vgpu-0000-41-00-5-1414",
                          "vgpu-0000-41-00-6-1414", "vgpu-0000-41-00-7-1414"));
  EXPECT_FALSE(scan->selection.functions.at("0000:c1:00.4").published);
  EXPECT_THAT(scan->selection.functions.at("0000:c1:00.4").reason,
              HasSubstr("holds vGPU 1415 (NVIDIA H100-40C), not published: denied by the policy "
                        "(deny[0])"));
  EXPECT_THAT(scan->selection.vgpu_gpus[1].state,
              HasSubstr("which the policy denies (deny[0]): nothing new is offered"));
  const std::string table = discovery::DiscoverTable(scan->inventory, scan->selection, {});
  EXPECT_THAT(table, ::testing::Not(HasSubstr("offered 1415")));
  // The same without a kind, and for a layout's type.
  auto layout = Scan(
      "deny:\n  - {vgpuType: \"1414\"}\n"
      "vgpuLayouts:\n"
      "  - {match: {address: \"0000:41:00.0\"}, vgpuType: \"1414\", count: 4, create: onDemand}\n");
  EXPECT_TRUE(Names(Build(*layout, CounterLayout::kOwnSlice)).size() == 1u);  // c1's 40C only
  EXPECT_THAT(layout->selection.vgpu_gpus[0].state, HasSubstr("which the policy denies (deny[0])"));
}

TEST(VgpuFrameBuffer, ComesFromTheTypeNameOrNotAtAll) {
  EXPECT_EQ(discovery::VgpuFrameBufferGb("NVIDIA H100-20C"), 20);
  EXPECT_EQ(discovery::VgpuFrameBufferGb("NVIDIA L40S-48Q"), 48);
  EXPECT_EQ(discovery::VgpuFrameBufferGb("GRID RTX6000-4Q"), 4);
  EXPECT_EQ(discovery::VgpuFrameBufferGb("NVIDIA H200X-1-18C"), std::nullopt);  // MIG-backed
  EXPECT_EQ(discovery::VgpuFrameBufferGb("NVIDIA H100-C"), std::nullopt);
  EXPECT_EQ(discovery::VgpuFrameBufferGb("NVIDIA H100-20c"), std::nullopt);
  EXPECT_EQ(discovery::VgpuFrameBufferGb("H100"), std::nullopt);
}

TEST(VgpuGpuSizesFile, RoundTripsAndABadFileIsMovedAsideWithAWarning) {
  FixtureNode node("");
  const std::string path = node.dir() + "/" + discovery::kVgpuGpuSizesFile;
  std::string warning;
  EXPECT_TRUE(discovery::LoadVgpuGpuSizesOrMoveAside(path, warning).empty());  // none yet
  EXPECT_EQ(warning, "");
  const discovery::VgpuGpuSizes sizes = {
      {"0000:41:00.0", {"10de:2331", 80, "NVIDIA H100-80C", {{1416, "NVIDIA H100-80C"}}}}};
  ASSERT_TRUE(discovery::SaveVgpuGpuSizes(path, sizes).ok());
  auto back = discovery::LoadVgpuGpuSizes(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, sizes);
  std::ofstream(path) << R"({"kind": "VgpuGpuSizes", "version": 1, "gpus": {"x": {"model": 1}}})";
  EXPECT_THAT(discovery::LoadVgpuGpuSizes(path).error().message,
              HasSubstr("gpus.x: expected {model, largestGB, largestType}"));
  EXPECT_TRUE(discovery::LoadVgpuGpuSizesOrMoveAside(path, warning).empty());
  EXPECT_THAT(warning, HasSubstr("moved aside to " + path + ".bad"));
  EXPECT_TRUE(std::filesystem::exists(path + ".bad"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(VgpuVfPolicy, AnEntryThatCanNeverMatchIsRefusedWithItsName) {
  auto both = discovery::ParseAdminPolicy(
      "deny:\n  - {address: \"0000:41:00.4\"}\n  - {mdevType: nvidia-222, vgpuType: \"1414\"}\n",
      "p.yaml");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.error().message, HasSubstr("p.yaml:3: deny[1]: names both mdevType and "
                                              "vgpuType and so can never match anything"));
  auto select = discovery::ParseAdminPolicy(
      "select:\n  - {kind: vgpu, mdevType: nvidia-222, vgpuType: \"1414\"}\n", "p.yaml");
  ASSERT_FALSE(select.ok());
  EXPECT_THAT(select.error().message, HasSubstr("select[0]"));
}

// A type the VF holds already is taken as the caller's only when the caller says its record set
// it; otherwise the VF is someone else's and is left alone, with the way to clear it.
TEST_F(VgpuVfNode, AssignTakesAHeldTypeOnlyWhenTheCallersRecordSetIt) {
  using Held = vfio::VgpuVfLifecycle::Held;
  SimulatedKernel kernel(node_->sysfs_root(), node_->dir() + "/dev");
  sysfs::SysfsReader sysfs(node_->sysfs_root());
  vfio::DeviceLockGate gate(kernel);
  vfio::VgpuVfLifecycle vgpus(sysfs, gate, std::chrono::seconds(5));
  const std::string vf = "0000:41:00.4";
  ASSERT_EQ(SetType(kernel, vf, 1415), 0);
  const size_t writes = kernel.Writes().size();
  Status refused = vgpus.Assign(vf, 1415, Held::kNotOurs);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message,
              HasSubstr("VF 0000:41:00.4 already holds vGPU type 1415 that vfio-dra did not "
                        "create for this claim"));
  EXPECT_THAT(refused.error().message, HasSubstr("echo 0 > "));
  EXPECT_FALSE(vgpus.CheckFree(vf).ok());
  EXPECT_TRUE(vgpus.CheckHolds(vf, 1415).ok());
  EXPECT_FALSE(vgpus.CheckHolds(vf, 1414).ok());
  // Another type than the one the record set is never the caller's.
  EXPECT_FALSE(vgpus.Assign(vf, 1414, Held::kOurs).ok());
  EXPECT_EQ(kernel.Writes().size(), writes) << "the VF is left alone";
  EXPECT_TRUE(vgpus.Assign(vf, 1415, Held::kOurs).ok());
  EXPECT_EQ(kernel.Writes().size(), writes) << "nothing to write";
  EXPECT_EQ(*vgpus.CurrentType(vf), 1415);
  EXPECT_TRUE(vgpus.CheckFree("0000:41:00.5").ok());
  EXPECT_TRUE(vgpus.Assign("0000:41:00.5", 1415, Held::kNotOurs).ok());
  EXPECT_EQ(*vgpus.CurrentType("0000:41:00.5"), 1415);
}

// A record with a vGPU is of version 3, so that a build before vGPU VFs leaves it in place
// instead of moving it aside as corrupt; records without stay readable by such builds.
TEST(VgpuVfCheckpoint, RecordsWithVgpusAreVersion3AndRoundTrip) {
  FixtureNode node("");
  auto checkpoint = prepare::PrepareCheckpoint::Open(node.dir(), "boot-1");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  prepare::ClaimRecord record;
  record.uid = "4f1c2a9e-0000-4000-8000-000000000009";
  record.namespace_ = "vms";
  record.name = "c";
  ASSERT_TRUE(checkpoint->Put(record).ok());
  const auto version = [&] {
    std::ifstream in(node.dir() + "/claims/" + record.uid + ".json");
    return nlohmann::json::parse(in)["version"].get<int>();
  };
  EXPECT_EQ(version(), 2);
  record.vgpus.push_back(
      {"0000:41:00.4", 1414, true, {"10de", "2331", "10de", "2331"}, "0000:41:00.0"});
  prepare::RecordedDevice device;
  device.request = "vgpu";
  device.pool = "node-1";
  device.device = "vgpu-0000-41-00-4-1414";
  device.is_vgpu = true;
  device.vgpu_type = 1414;
  device.address = "0000:41:00.4";
  device.iommu_group = 81;
  device.iommu_interface = "legacy";
  record.devices.push_back(device);
  ASSERT_TRUE(checkpoint->Put(record).ok());
  EXPECT_EQ(version(), 3);
  auto back = checkpoint->Find(record.uid);
  ASSERT_TRUE(back.ok() && back->has_value());
  record.boot_id = "boot-1";
  EXPECT_EQ(**back, record);
}

}  // namespace
}  // namespace vfio_dra::testing
