// The declared vGPU layout's applier on the simulated kernel (vgpu-vf fixture: an idle H100 at
// 41:00.0 with 4 VFs, types 1414 x4, 1415 x2, 1416 x1 per GPU; one at c1:00.0 with 2 VFs whose
// first holds a 1415): what it creates, where the driver stops it, what it leaves alone, how it
// yields to a call's device locks and to claims' records, and that a claim hands out and gives
// back a vGPU it made without destroying it, also through a restart.
#include "prepare/vgpu_layout_applier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>

#include "discovery/admin_policy.h"
#include "discovery/node_scan.h"
#include "prepare/prepare_checkpoint.h"
#include "prepare/prepare_locks.h"
#include "prepare/vfio_device_preparer.h"
#include "simulated_kernel.h"
#include "slicepublisher/slice_builder.h"
#include "unit/fixture_node.h"

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr const char* kUid = "5b0e7a31-0000-4000-8000-000000000001";

class VgpuLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<FixtureNode>("vgpu-vf");
    sysfs_ = std::make_unique<sysfs::SysfsReader>(node_->sysfs_root());
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), node_->dir() + "/dev");
    fs::create_directories(DataDir());
    auto checkpoint = prepare::PrepareCheckpoint::Open(DataDir(), "boot-1");
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().message;
    checkpoint_.emplace(std::move(*checkpoint));
  }
  std::string DataDir() const { return node_->dir() + "/data"; }
  // An applier under `policy_yaml`, logging to log_.
  void Open(const std::string& policy_yaml) {
    auto policy = discovery::ParseAdminPolicy(policy_yaml, "policy.yaml");
    ASSERT_TRUE(policy.ok()) << policy.error().message;
    policy_ = std::move(*policy);
    prepare::VgpuLayoutOptions options;
    options.plugin_data_dir = DataDir();
    options.lock_wait = std::chrono::milliseconds(0);
    options.before_step = [this](const std::string& step) { steps_.push_back(step); };
    auto applier = prepare::VgpuLayoutApplier::Open(
        options, policy_, *sysfs_, *kernel_, *checkpoint_,
        Logger::ToFunction(
            [this](std::string_view level, std::string_view line) {
              std::lock_guard<std::mutex> lock(log_mu_);
              log_.push_back(std::string(level) + " " + std::string(line));
            },
            0));
    ASSERT_TRUE(applier.ok()) << applier.error().message;
    applier_ = std::move(*applier);
  }
  // A fresh scan and one pass over it.
  prepare::VgpuLayoutPass Pass() {
    auto scan = discovery::ScanNode(*sysfs_, nullptr, policy_);
    return applier_->Apply(scan->inventory);
  }
  std::string Type(const std::string& vf) const {
    std::ifstream in(node_->sysfs_root() + "/bus/pci/devices/" + vf + "/nvidia/current_vgpu_type");
    std::string text;
    std::getline(in, text);
    return text;
  }
  // The writes to current_vgpu_type since `from`, as "<VF>=<value>:<errno>".
  std::vector<std::string> TypeWrites(size_t from = 0) const {
    std::vector<std::string> out;
    const std::vector<SimWrite> writes = kernel_->Writes();
    for (size_t i = from; i < writes.size(); ++i) {
      const SimWrite& w = writes[i];
      if (w.path.find("current_vgpu_type") == std::string::npos) continue;
      const std::string vf = w.path.substr(w.path.find("0000:"), 12);
      out.push_back(vf + "=" + w.value + ":" + std::to_string(w.result));
    }
    return out;
  }
  std::vector<std::string> Logged(const std::string& level) {
    std::lock_guard<std::mutex> lock(log_mu_);
    std::vector<std::string> out;
    for (const std::string& line : log_) {
      if (line.rfind(level + " ", 0) == 0) out.push_back(line);
    }
    return out;
  }
  static std::string Layout(const std::string& gpu, const std::string& type,
                            const std::string& count) {
    return "vgpuLayouts:\n  - match: {address: \"" + gpu + "\"}\n    vgpuType: \"" + type +
           "\"\n    count: " + count + "\n";
  }

  std::unique_ptr<FixtureNode> node_;
  std::unique_ptr<sysfs::SysfsReader> sysfs_;
  std::unique_ptr<SimulatedKernel> kernel_;
  std::optional<prepare::PrepareCheckpoint> checkpoint_;
  discovery::AdminPolicy policy_;
  std::unique_ptr<prepare::VgpuLayoutApplier> applier_;
  std::vector<std::string> steps_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(VgpuLayoutTest, ACountOfTwoCreatesExactlyTwoInAddressOrderTheTypeNamedByName) {
  Open(Layout("0000:41:00.0", "NVIDIA H100-20C", "2"));
  const prepare::VgpuLayoutPass pass = Pass();
  EXPECT_EQ(pass.created, 2);
  EXPECT_FALSE(pass.retry);
  EXPECT_EQ(TypeWrites(), (std::vector<std::string>{"0000:41:00.4=1414:0", "0000:41:00.5=1414:0"}));
  EXPECT_EQ(steps_,
            (std::vector<std::string>{"vgpu-layout:0000:41:00.4", "vgpu-layout:0000:41:00.5"}));
  EXPECT_EQ(Type("0000:41:00.6"), "0");
  EXPECT_EQ(Type("0000:41:00.7"), "0");
  EXPECT_EQ(Type("0000:c1:00.5"), "0") << "another GPU";
  // The layout is met: the next pass writes nothing.
  const size_t writes = kernel_->Writes().size();
  EXPECT_EQ(Pass().created, 0);
  EXPECT_EQ(kernel_->Writes().size(), writes);
  EXPECT_THAT(Logged("warning"), IsEmpty());
}

TEST_F(VgpuLayoutTest, MaxCreatesUntilTheDriverRefusesAndThenWritesNoMore) {
  Open(Layout("0000:41:00.0", "1415", "max"));
  EXPECT_EQ(Pass().created, 2);
  // The third write is the driver's refusal (ENODEV): the GPU holds two 40C.
  EXPECT_EQ(TypeWrites(), (std::vector<std::string>{"0000:41:00.4=1415:0", "0000:41:00.5=1415:0",
                                                    "0000:41:00.6=1415:19"}));
  EXPECT_EQ(Type("0000:41:00.6"), "0");
  EXPECT_EQ(Type("0000:41:00.7"), "0");
  const size_t writes = kernel_->Writes().size();
  EXPECT_EQ(Pass().created, 0);
  EXPECT_EQ(kernel_->Writes().size(), writes) << "full: no VF lists the type any more";
  EXPECT_THAT(Logged("warning"), IsEmpty());
}

TEST_F(VgpuLayoutTest, ACountThatDoesNotFitStopsAtTheDriversRefusalAndWarnsOnce) {
  Open(Layout("0000:41:00.0", "1415", "3"));
  EXPECT_EQ(Pass().created, 2);
  ASSERT_EQ(Logged("warning").size(), 1u);
  const std::string warning = Logged("warning").front();
  EXPECT_THAT(warning, HasSubstr("vgpuLayouts[0]: GPU 0000:41:00.0 holds 2 of vGPU type 1415"));
  EXPECT_THAT(warning, HasSubstr("ENODEV"));
  EXPECT_THAT(warning, HasSubstr("declared count 3: lower count to 2 or use count: max"));
  const size_t writes = kernel_->Writes().size();
  EXPECT_EQ(Pass().created, 0);
  EXPECT_EQ(kernel_->Writes().size(), writes);
  EXPECT_EQ(Logged("warning").size(), 1u) << "logged once";
}

TEST_F(VgpuLayoutTest, AGpuRunningAnotherTypeIsLeftAloneAndLoggedOnce) {
  Open(Layout("0000:c1:00.0", "1414", "max"));
  EXPECT_EQ(Pass().created, 0);
  EXPECT_EQ(Pass().created, 0);
  EXPECT_THAT(TypeWrites(), IsEmpty());
  EXPECT_EQ(Type("0000:c1:00.4"), "1415");
  EXPECT_EQ(Type("0000:c1:00.5"), "0");
  ASSERT_EQ(Logged("warning").size(), 1u);
  EXPECT_THAT(Logged("warning").front(),
              HasSubstr("GPU 0000:c1:00.0 runs vGPU type 1415 (on 1 VF), not the layout's"));
  EXPECT_THAT(Logged("warning").front(), HasSubstr("never destroys"));
}

// What a crash between two writes leaves: fewer than the count, all of the type. The next pass
// tops it up with one write.
TEST_F(VgpuLayoutTest, APartialLayoutIsToppedUp) {
  Open(Layout("0000:c1:00.0", "NVIDIA H100-40C", "2"));
  EXPECT_EQ(Pass().created, 1);
  EXPECT_EQ(TypeWrites(), (std::vector<std::string>{"0000:c1:00.5=1415:0"}));
  EXPECT_EQ(Type("0000:c1:00.4"), "1415");
}

TEST_F(VgpuLayoutTest, AHeldDeviceLockMeansNothingIsWrittenAndTheNextPassApplies) {
  Open(Layout("0000:41:00.0", "1414", "2"));
  auto locks = prepare::PrepareLocks::Open(DataDir());
  ASSERT_TRUE(locks.ok());
  {
    // A prepare of a vGPU of this GPU holds the PF's lock while it works.
    prepare::DeviceLockSet call(*locks);
    std::string busy;
    ASSERT_TRUE(*call.TryAdd({"0000:41:00.0"}, busy));
    const prepare::VgpuLayoutPass pass = Pass();
    EXPECT_EQ(pass.created, 0);
    EXPECT_TRUE(pass.retry);
    EXPECT_THAT(TypeWrites(), IsEmpty());
  }
  const prepare::VgpuLayoutPass pass = Pass();
  EXPECT_EQ(pass.created, 2);
  EXPECT_FALSE(pass.retry);
}

TEST_F(VgpuLayoutTest, VfsAClaimsRecordNamesAndDeniedVfsAreSkipped) {
  Open(Layout("0000:41:00.0", "1414", "2") + "deny:\n  - address: \"0000:41:00.5\"\n");
  // A prepare that recorded its start on VF 4 and has not set the type yet.
  prepare::ClaimRecord record;
  record.uid = kUid;
  record.namespace_ = "vms";
  record.name = "vm";
  record.vgpus.push_back({"0000:41:00.4", 1414, true, {}, "0000:41:00.0"});
  ASSERT_TRUE(checkpoint_->Put(record).ok());
  EXPECT_EQ(Pass().created, 2);
  EXPECT_EQ(TypeWrites(), (std::vector<std::string>{"0000:41:00.6=1414:0", "0000:41:00.7=1414:0"}));
}

TEST_F(VgpuLayoutTest, AnOpenVfIsSkippedAndTakenAtTheNextPass) {
  Open(Layout("0000:41:00.0", "1414", "max"));
  kernel_->OpenVgpuVf("0000:41:00.4");
  prepare::VgpuLayoutPass pass = Pass();
  EXPECT_EQ(pass.created, 3);
  EXPECT_TRUE(pass.retry);
  EXPECT_EQ(Type("0000:41:00.4"), "0");
  kernel_->CloseVgpuVf("0000:41:00.4");
  pass = Pass();
  EXPECT_EQ(pass.created, 1);
  EXPECT_FALSE(pass.retry);
  EXPECT_EQ(Type("0000:41:00.4"), "1414");
}

// A vGPU the layout made is published as it exists; a claim allocated it is handed it as it is
// and gives it back in place, and a restart's recovery of a prepare cut short does not take it for
// the claim's leftover.
TEST_F(VgpuLayoutTest, AClaimOfALayoutVgpuLeavesItInPlaceThroughUnprepareAndRecovery) {
  Open(Layout("0000:41:00.0", "1415", "max"));
  ASSERT_EQ(Pass().created, 2);
  std::ofstream(node_->dir() + "/boot_id") << "boot-1\n";
  slicepublisher::PublishedDevices published;
  slicepublisher::MdevTypeMaxima maxima;
  auto scan = discovery::ScanNode(*sysfs_, nullptr, policy_);
  published.Set(slicepublisher::BuildDesiredPool(
      *scan, {"node1", slicepublisher::CounterLayout::kOwnSlice}, maxima));
  auto device = published.Find("node1", "vgpu-0000-41-00-5-1415");
  ASSERT_TRUE(device.has_value());
  EXPECT_TRUE(device->consumes_counters.empty()) << "an existing vGPU, allocatable once";
  struct Crash {};
  const auto open_preparer = [&](bool crash) {
    prepare::PreparerOptions options;
    options.driver_name = "vfio.dra.io";
    options.node_name = "node1";
    options.plugin_data_dir = DataDir();
    options.cdi_dir = node_->dir() + "/cdi";
    options.dev_root = node_->dir() + "/dev";
    options.boot_id_file = node_->dir() + "/boot_id";
    if (crash) {
      options.before_step = [](const std::string& step) {
        if (step == "cdi:write") throw Crash{};
      };
    }
    fs::create_directories(options.cdi_dir);
    auto preparer =
        prepare::VfioDevicePreparer::Open(options, *sysfs_, *kernel_, published, Logger::Discard());
    EXPECT_TRUE(preparer.ok()) << preparer.error().message;
    return preparer.ok() ? std::move(*preparer) : nullptr;
  };
  kube::ResourceClaim claim;
  claim.namespace_ = "vms";
  claim.name = "vm";
  claim.uid = kUid;
  claim.generation = 1;
  claim.allocation.emplace();
  kube::DeviceRequestAllocationResult result;
  result.request = "vgpu";
  result.driver = "vfio.dra.io";
  result.pool = "node1";
  result.device = "vgpu-0000-41-00-5-1415";
  claim.allocation->results.push_back(result);
  const size_t writes = kernel_->Writes().size();

  // Killed halfway through the prepare: the record is in PrepareStarted; recovery rolls it back.
  auto preparer = open_preparer(true);
  ASSERT_NE(preparer, nullptr);
  EXPECT_THROW((void)preparer->Prepare(claim, claim.allocation->results, Deadline()), Crash);
  auto record = checkpoint_->Find(kUid);
  ASSERT_TRUE(record.ok() && record->has_value());
  ASSERT_EQ((*record)->vgpus.size(), 1u);
  EXPECT_FALSE((*record)->vgpus[0].created_by_us) << "not made for the claim";
  preparer = open_preparer(false);
  ASSERT_NE(preparer, nullptr);
  ASSERT_TRUE(preparer->Recover().ok());
  record = checkpoint_->Find(kUid);
  ASSERT_TRUE(record.ok());
  EXPECT_FALSE(record->has_value()) << "rolled back";
  EXPECT_EQ(Type("0000:41:00.5"), "1415") << "recovery left it in place";

  // Prepared and unprepared: handed out as it is, left in place for the next claim.
  auto prepared = preparer->Prepare(claim, claim.allocation->results, Deadline());
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_TRUE(preparer->Unprepare({"vms", "vm", kUid}, Deadline()).ok());
  EXPECT_EQ(Type("0000:41:00.4"), "1415");
  EXPECT_EQ(Type("0000:41:00.5"), "1415");
  EXPECT_THAT(TypeWrites(writes), IsEmpty()) << "no vGPU type written by prepare or unprepare";
  EXPECT_EQ(Pass().created, 0);
}

}  // namespace
}  // namespace vfio_dra::testing
