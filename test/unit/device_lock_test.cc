// The kernel's device lock during an unbind that waits for a VFIO user, in the simulated kernel
// (the driver link goes first; reads and writes of the device's lock-taking attributes block),
// and what the daemon's side does about it: every such access is bounded, a held device is
// refused at once naming who holds it, and rescans skip it. Each of these hung or misbehaved
// against the kernel before the simulation modelled the lock.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "base/file_io.h"
#include "discovery/node_scan.h"
#include "simulated_kernel.h"
#include "sysfs/bounded_reads.h"
#include "unit/fixture_node.h"
#include "vfio/device_holders.h"
#include "vfio/device_lock_gate.h"
#include "vfio/vfio_pci_binder.h"

namespace vfio_dra::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kAudio = "0000:01:00.1";  // the workstation GPU's audio function

class DeviceLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = std::make_unique<FixtureNode>("workstation");
    sysfs_ = std::make_unique<sysfs::SysfsReader>(node_->sysfs_root());
    kernel_ = std::make_unique<SimulatedKernel>(node_->sysfs_root(), node_->dir() + "/dev");
  }
  std::string Attr(const std::string& address, const std::string& name) const {
    return node_->sysfs_root() + "/bus/pci/devices/" + address + "/" + name;
  }
  // Starts an unbind of the audio function that hangs, and waits until the kernel holds it.
  std::future<int> HangingUnbind() {
    kernel_->HangUnbind(kAudio);
    auto unbind = std::async(std::launch::async, [this] {
      return kernel_->Write(node_->sysfs_root() + "/bus/pci/drivers/snd_hda_intel/unbind", kAudio);
    });
    EXPECT_TRUE(kernel_->WaitUntilHanging(1, std::chrono::seconds(30)));
    return unbind;
  }
  static bool ReadWouldBlock(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 0);
    ::close(fd);
    return ready == 0;
  }

  std::unique_ptr<FixtureNode> node_;
  std::unique_ptr<sysfs::SysfsReader> sysfs_;
  std::unique_ptr<SimulatedKernel> kernel_;
};

// The kernel removes the driver link before it waits for the VFIO user, and holds the device
// lock while it waits: driver_override cannot be read until the user lets go.
TEST_F(DeviceLockTest, AStuckUnbindRemovesTheDriverLinkAndBlocksLockTakingReads) {
  const std::string before = *ReadFileToString(Attr(kAudio, "driver_override"));
  auto unbind = HangingUnbind();
  EXPECT_FALSE(fs::exists(fs::symlink_status(Attr(kAudio, "driver"))))
      << "the driver link is gone while the unbind waits";
  EXPECT_TRUE(ReadWouldBlock(Attr(kAudio, "driver_override")));
  EXPECT_TRUE(ReadWouldBlock(Attr(kAudio, "uevent"))) << "as on the QEMU node's Debian 6.1";
  EXPECT_FALSE(ReadWouldBlock(Attr(kAudio, "vendor"))) << "plain attributes do not take the lock";
  ASSERT_TRUE(fs::exists(Attr(kAudio, "modalias")));
  EXPECT_FALSE(ReadWouldBlock(Attr(kAudio, "modalias")));
  // A reader that started while the lock was held gets the value once it is released.
  auto reader = std::async(std::launch::async,
                           [this] { return ReadFileToString(Attr(kAudio, "driver_override")); });
  kernel_->ReleaseHangs();
  EXPECT_EQ(unbind.get(), 0);
  auto read = reader.get();
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(*read == before || read->empty()) << *read;
  EXPECT_FALSE(ReadWouldBlock(Attr(kAudio, "driver_override")));
  EXPECT_EQ(*ReadFileToString(Attr(kAudio, "driver_override")), before);
}

// Writes to a held device wait for the lock: they return only after the blocked unbind did.
TEST_F(DeviceLockTest, WritesToAHeldDeviceWaitForTheLock) {
  auto unbind = HangingUnbind();
  auto write = std::async(std::launch::async, [this] {
    return kernel_->Write(Attr(kAudio, "driver_override"), "vfio-pci");
  });
  kernel_->ReleaseHangs();
  EXPECT_EQ(unbind.get(), 0);
  EXPECT_EQ(write.get(), 0);
  const auto writes = kernel_->Writes();
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_THAT(writes[0].path, HasSubstr("unbind")) << "the unbind returned first";
  EXPECT_THAT(writes[1].path, HasSubstr("driver_override"));
}

// The daemon's side: the first access that blocks fails at its deadline; every later one on the
// device is refused at once, whatever the driver link says, naming what blocks and who holds the
// device; once the kernel lets go, the device can be used again.
TEST_F(DeviceLockTest, AHeldDeviceIsRefusedAtOnceNamingItsHolders) {
  const std::string dev = node_->dir() + "/dev";
  // Bind the GPU's group to vfio-pci, so /dev/vfio/<group> exists, and let "a VMM" hold it.
  vfio::DeviceLockGate gate(*kernel_);
  vfio::VfioPciBinder binder(*sysfs_, gate,
                             vfio::BinderOptions{std::chrono::milliseconds(200), dev, "/proc"});
  ASSERT_TRUE(binder.BindToVfio("0000:01:00.0").ok());
  ASSERT_TRUE(binder.BindToVfio(kAudio).ok());
  auto group = sysfs_->LinkBaseName("bus/pci/devices/" + std::string(kAudio) + "/iommu_group");
  ASSERT_TRUE(group.ok());
  const int vmm = ::open((dev + "/vfio/" + *group).c_str(), O_PATH | O_CLOEXEC);
  ASSERT_GE(vmm, 0);

  kernel_->HangUnbind(kAudio);
  const vfio::OriginalBinding original{kAudio, "snd_hda_intel", "", false};
  auto first = binder.Restore(original);
  ASSERT_FALSE(first.ok());
  // The restore's accesses run as one operation; the message names the one the kernel blocks.
  EXPECT_THAT(first.error().message,
              HasSubstr("unbinding 0000:01:00.1 from vfio-pci: write of \"0000:01:00.1\" to " +
                        node_->sysfs_root() +
                        "/bus/pci/drivers/vfio-pci/unbind did not finish "
                        "within 200 ms"));
  EXPECT_THAT(first.error().message, HasSubstr("held by pid " + std::to_string(::getpid())));
  EXPECT_EQ(kernel_->Hanging(), 1);
  ASSERT_TRUE(binder.Busy(kAudio).has_value());
  EXPECT_THAT(*binder.Busy(kAudio), HasSubstr("an earlier unbinding 0000:01:00.1 from vfio-pci"));

  // The kernel removed the driver link, so nothing in sysfs says "busy" any more; the retries must
  // not touch the device (each access would block on the lock) and must answer at once.
  for (int retry = 0; retry < 2; ++retry) {
    auto again = binder.Restore(original);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().kind, ErrorKind::kUnavailable);
    EXPECT_THAT(again.error().message, HasSubstr("0000:01:00.1 is still in use"));
    EXPECT_THAT(again.error().message, HasSubstr("held by pid " + std::to_string(::getpid())));
    auto bind = binder.BindToVfio(kAudio);
    ASSERT_FALSE(bind.ok());
    EXPECT_THAT(bind.error().message, HasSubstr("0000:01:00.1 is still in use"));
    EXPECT_FALSE(binder.Inspect(kAudio).ok());
  }
  EXPECT_EQ(kernel_->Hanging(), 1) << "no second access is blocked in the kernel";

  ::close(vmm);  // the VMM exits
  kernel_->ReleaseHangs();
  kernel_->WaitIdle();
  // The blocked unbind returns just after the kernel; the gate forgets it right after.
  auto restored = binder.Restore(original);
  for (int attempt = 0; !restored.ok() && attempt < 1000; ++attempt) {
    std::this_thread::yield();
    restored = binder.Restore(original);
  }
  ASSERT_TRUE(restored.ok()) << restored.error().message;
  EXPECT_FALSE(binder.Busy(kAudio).has_value());
}

// A rescan while the kernel holds a device reads none of its lock-taking attributes (uevent
// included) instead of blocking, and the device stays in the scan (no slice churn).
TEST_F(DeviceLockTest, ARescanSkipsTheHeldDeviceAndKeepsItPublished) {
  const auto before = discovery::ScanNode(*sysfs_, nullptr, discovery::AdminPolicy{});
  auto unbind = HangingUnbind();
  auto scan = std::async(std::launch::async, [this] {
    return discovery::ScanNode(*sysfs_, nullptr, discovery::AdminPolicy{});
  });
  // A failure detector, not a synchronisation: the scan takes milliseconds; only one blocked on
  // the lock (as it did when it read uevent) would still be running after a minute.
  const bool answered = scan.wait_for(std::chrono::minutes(1)) == std::future_status::ready;
  if (!answered) kernel_->ReleaseHangs();  // lets the blocked scan finish, so the test ends
  ASSERT_TRUE(answered) << "the scan blocked on the held device's lock";
  const auto during = scan.get();
  EXPECT_EQ(during->inventory.functions.count(kAudio), 1u);
  EXPECT_EQ(during->selection.devices.size(), before->selection.devices.size());
  kernel_->ReleaseHangs();
  EXPECT_EQ(unbind.get(), 0);
}

// Another process (the other instance of a rolling update) is stuck unbinding an SR-IOV PF, so
// the kernel holds its lock, and this daemon's gate knows nothing of it. A scan reads nothing that
// takes the lock: it answers, with the PF's VFs counted (by their virtfn links, as sriov_numvfs
// would say) and the PF still not handed out whole.
TEST(DeviceLockOfAnotherProcess, AScanNeitherBlocksNorLosesThePfsVfs) {
  FixtureNode node("sriov");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  const auto before = discovery::ScanNode(sysfs, nullptr, discovery::AdminPolicy{});
  ASSERT_EQ(before->inventory.functions.at("0000:5e:00.0").sriov_pf->num_vfs, 8);
  SimulatedKernel other_process(node.sysfs_root(), node.dir() + "/dev");
  other_process.HangUnbind("0000:5e:00.0");
  auto stuck = std::async(std::launch::async, [&] {
    return other_process.Write(node.sysfs_root() + "/bus/pci/drivers/i40e/unbind", "0000:5e:00.0");
  });
  ASSERT_TRUE(other_process.WaitUntilHanging(1, std::chrono::seconds(30)));
  auto scan = std::async(std::launch::async, [&] {
    return discovery::ScanNode(sysfs, nullptr, discovery::AdminPolicy{});
  });
  // A failure detector, not a synchronisation: the scan takes milliseconds; only one blocked on
  // the lock would still be running after a minute.
  const bool answered = scan.wait_for(std::chrono::minutes(1)) == std::future_status::ready;
  other_process.ReleaseHangs();  // lets a blocked scan finish, so the test ends either way
  ASSERT_TRUE(answered) << "the scan blocked on the device lock another process holds";
  const auto during = scan.get();
  const discovery::PciFunction& pf = during->inventory.functions.at("0000:5e:00.0");
  ASSERT_TRUE(pf.sriov_pf.has_value());
  EXPECT_EQ(pf.sriov_pf->num_vfs, 8);
  EXPECT_EQ(during->selection.devices.size(), before->selection.devices.size());
  EXPECT_EQ(stuck.get(), 0);
  other_process.WaitIdle();
}

// `discover` reports driver_override, and admins run it when a device is stuck: its reads are
// bounded. The one of the function another process is stuck unbinding answers "did not answer",
// and the reads after it still answer (a new reader process goes on past the stuck one).
TEST(DeviceLockOfAnotherProcess, BoundedReadsAnswerForEveryAttributeAndNameTheLockedOne) {
  FixtureNode node("workstation");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  SimulatedKernel other_process(node.sysfs_root(), node.dir() + "/dev");
  other_process.HangUnbind(kAudio);
  auto stuck = std::async(std::launch::async, [&] {
    return other_process.Write(node.sysfs_root() + "/bus/pci/drivers/snd_hda_intel/unbind", kAudio);
  });
  ASSERT_TRUE(other_process.WaitUntilHanging(1, std::chrono::seconds(30)));
  const std::vector<std::string> paths = {
      "bus/pci/devices/0000:01:00.0/driver_override",
      std::string("bus/pci/devices/") + kAudio + "/driver_override",
      "bus/pci/devices/0000:03:00.0/driver_override",
      "bus/pci/devices/0000:03:00.0/no_such_attribute"};
  auto reads = std::async(std::launch::async, [&] {
    // Long enough that a busy machine answers the free reads in time; paid once, for the stuck one.
    return sysfs::ReadAttributesBounded(sysfs, paths, std::chrono::milliseconds(2000));
  });
  // A failure detector, not a synchronisation: only a read blocked on the lock runs for a minute.
  const bool answered = reads.wait_for(std::chrono::minutes(1)) == std::future_status::ready;
  other_process.ReleaseHangs();
  ASSERT_TRUE(answered) << "a read waited for the device lock another process holds";
  const auto read = reads.get();
  ASSERT_EQ(read.size(), 4u);
  ASSERT_TRUE(read[0].ok()) << read[0].error().message;
  EXPECT_EQ(*read[0], "(null)\n");
  ASSERT_FALSE(read[1].ok());
  EXPECT_EQ(read[1].error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_THAT(read[1].error().message, HasSubstr(std::string(kAudio) + "/driver_override"));
  EXPECT_THAT(read[1].error().message, HasSubstr("did not answer within 2000 ms"));
  ASSERT_TRUE(read[2].ok()) << read[2].error().message;
  EXPECT_EQ(*read[2], "(null)\n");
  ASSERT_FALSE(read[3].ok());
  EXPECT_EQ(read[3].error().kind, ErrorKind::kNotFound);
  EXPECT_EQ(stuck.get(), 0);
  other_process.WaitIdle();
}

TEST(DeviceHolders, FindsTheProcessesHoldingACharacterDeviceByItsNumber) {
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const auto holders = vfio::FindDeviceHolders("/proc", {st.st_rdev});
  bool me = false;
  for (const auto& holder : holders) me = me || holder.pid == ::getpid();
  EXPECT_TRUE(me);
  EXPECT_THAT(vfio::DescribeHolders(holders), HasSubstr("pid " + std::to_string(::getpid())));
  ::close(fd);
  EXPECT_THAT(vfio::DescribeHolders({}), HasSubstr("no process"));
}

}  // namespace
}  // namespace vfio_dra::testing
