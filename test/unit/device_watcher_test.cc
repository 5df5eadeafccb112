#include "discovery/device_watcher.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "discovery/change_probe.h"
#include "simulated_kernel.h"
#include "unit/fixture_node.h"

namespace vfio_dra::discovery {
namespace {

using vfio_dra::testing::FixtureNode;
using vfio_dra::testing::SysfsFixture;

// Counts scans and handed-on results, and lets the test wait for either.
class Recorder {
 public:
  std::shared_ptr<const NodeScan> Scan(const sysfs::SysfsReader& sysfs) {
    auto scan = ScanNode(sysfs, nullptr, AdminPolicy{});
    std::lock_guard<std::mutex> lock(mu_);
    ++scans_;
    cv_.notify_all();
    return scan;
  }
  void Publish(std::shared_ptr<const NodeScan> scan) {
    std::lock_guard<std::mutex> lock(mu_);
    published_.push_back(std::move(scan));
    cv_.notify_all();
  }
  bool WaitForScans(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return scans_ >= n; });
  }
  bool WaitForPublished(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return published_.size() >= n; });
  }
  size_t published() {
    std::lock_guard<std::mutex> lock(mu_);
    return published_.size();
  }
  int scans() {
    std::lock_guard<std::mutex> lock(mu_);
    return scans_;
  }
  std::shared_ptr<const NodeScan> last() {
    std::lock_guard<std::mutex> lock(mu_);
    return published_.back();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int scans_ = 0;
  std::vector<std::shared_ptr<const NodeScan>> published_;
};

void AddGpu(const std::string& root, const std::string& address, int group) {
  SysfsFixture fx(root);
  fx.AddPci(vfio_dra::testing::MakePciSpec(address, 0x10de, 0x2230, 0x030000, "", group));
}

TEST(DeviceWatcher, ATriggerHandsOnTheChangedNodeWithinTheQuietPeriod) {
  FixtureNode node("workstation");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  Recorder recorder;
  DeviceWatcherOptions options;
  options.listen_for_uevents = false;
  options.rescan_interval = std::chrono::hours(1);
  DeviceWatcher watcher([&] { return recorder.Scan(sysfs); },
                        [&](auto scan) { recorder.Publish(std::move(scan)); }, options,
                        Logger::Discard());
  watcher.Start();
  ASSERT_EQ(recorder.published(), 1u);  // the first scan is handed on before Start returns
  EXPECT_EQ(recorder.last()->selection.devices.size(), 2u);

  // Nothing changed: a rescan happens but nothing is handed on.
  watcher.Trigger();
  ASSERT_TRUE(recorder.WaitForScans(2));
  EXPECT_EQ(recorder.published(), 1u);

  AddGpu(node.sysfs_root(), "0000:09:00.0", 90);
  const auto before = std::chrono::steady_clock::now();
  watcher.Trigger();
  ASSERT_TRUE(recorder.WaitForPublished(2));
  // Far below the periodic rescan (an hour): the trigger did it, even on a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(60));
  EXPECT_EQ(recorder.last()->selection.devices.size(), 3u);
  watcher.Stop();
}

TEST(DeviceWatcher, ThePeriodicRescanCatchesMissedEvents) {
  FixtureNode node("workstation");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  Recorder recorder;
  DeviceWatcherOptions options;
  options.listen_for_uevents = false;
  options.rescan_interval = std::chrono::milliseconds(50);
  DeviceWatcher watcher([&] { return recorder.Scan(sysfs); },
                        [&](auto scan) { recorder.Publish(std::move(scan)); }, options,
                        Logger::Discard());
  watcher.Start();
  AddGpu(node.sysfs_root(), "0000:09:00.0", 90);
  ASSERT_TRUE(recorder.WaitForPublished(2));
  EXPECT_EQ(recorder.last()->selection.devices.size(), 3u);
  watcher.Stop();
  // The watcher keeps no scan of its own: the listener's is the only one (plus this copy).
  EXPECT_EQ(recorder.last().use_count(), 2);
}

// Counts probes and lets the test wait for them.
class ProbeCounter {
 public:
  explicit ProbeCounter(const sysfs::SysfsReader& sysfs) : probe_(sysfs) {}
  uint64_t Probe() {
    const uint64_t digest = probe_.Probe();
    std::lock_guard<std::mutex> lock(mu_);
    ++probes_;
    cv_.notify_all();
    return digest;
  }
  bool WaitForProbes(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return probes_ >= n; });
  }

 private:
  ChangeProbe probe_;
  std::mutex mu_;
  std::condition_variable cv_;
  int probes_ = 0;
};

// The idle daemon's periodic work is the probe, not the full scan, while nothing changes; a
// change the probe sees is scanned and handed on.
TEST(DeviceWatcher, ThePeriodicCheckProbesInsteadOfScanningWhileNothingChanges) {
  FixtureNode node("workstation");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  Recorder recorder;
  ProbeCounter probes(sysfs);
  std::mutex settled_mu;
  std::condition_variable settled_cv;
  int settled = 0;
  DeviceWatcherOptions options;
  options.listen_for_uevents = false;
  options.rescan_interval = std::chrono::milliseconds(10);
  options.full_rescan_interval = std::chrono::hours(1);
  options.on_settled = [&] {
    std::lock_guard<std::mutex> lock(settled_mu);
    ++settled;
    settled_cv.notify_all();
  };
  DeviceWatcher watcher([&] { return recorder.Scan(sysfs); },
                        [&](auto scan) { recorder.Publish(std::move(scan)); }, options,
                        Logger::Discard(), [&] { return probes.Probe(); });
  watcher.Start();
  ASSERT_TRUE(probes.WaitForProbes(6));
  EXPECT_EQ(recorder.scans(), 1) << "only the first scan: the probes saw no change";
  EXPECT_GE(watcher.skipped_scans(), 4);
  {
    std::lock_guard<std::mutex> lock(settled_mu);
    EXPECT_EQ(settled, 1) << "settled once after the scan, not at every quiet check";
  }
  AddGpu(node.sysfs_root(), "0000:09:00.0", 90);
  // The fixture writes the device in several steps; a scan may see it half-written (and warn),
  // and then the next check scans again, until the device is complete.
  for (size_t n = 2; recorder.WaitForPublished(n); ++n) {
    if (recorder.last()->selection.devices.size() == 3u) break;
  }
  EXPECT_EQ(recorder.last()->selection.devices.size(), 3u);
  {
    // Settled again once the change has been handed on and the checks are quiet again.
    std::unique_lock<std::mutex> lock(settled_mu);
    EXPECT_TRUE(settled_cv.wait_for(lock, std::chrono::seconds(30), [&] { return settled >= 2; }));
  }
  watcher.Stop();
}

// The probe is a filter, not the truth: a full scan still runs every full_rescan_interval.
TEST(DeviceWatcher, AFullScanStillRunsAtTheFullRescanInterval) {
  FixtureNode node("workstation");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  Recorder recorder;
  DeviceWatcherOptions options;
  options.listen_for_uevents = false;
  options.rescan_interval = std::chrono::milliseconds(10);
  options.full_rescan_interval = std::chrono::milliseconds(0);
  DeviceWatcher watcher([&] { return recorder.Scan(sysfs); },
                        [&](auto scan) { recorder.Publish(std::move(scan)); }, options,
                        Logger::Discard(), [] { return uint64_t{42}; });
  watcher.Start();
  ASSERT_TRUE(recorder.WaitForScans(3));
  watcher.Stop();
}

TEST(ChangeProbe, SeesBindingsDevicesAndMdevsAndNothingElse) {
  FixtureNode node("vgpu");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  ChangeProbe probe(sysfs);
  const uint64_t first = probe.Probe();
  EXPECT_EQ(probe.Probe(), first) << "stable while nothing changes";
  // An attribute that is not part of the state (and may take the device lock) is not read.
  const std::string gpu = node.sysfs_root() + "/bus/pci/devices/0000:3b:00.0";
  std::filesystem::remove(gpu + "/driver_override");
  EXPECT_EQ(probe.Probe(), first);
  // An unbind removes the function's driver link and its entry under the driver together.
  const std::string driver = std::filesystem::read_symlink(gpu + "/driver").filename().string();
  std::filesystem::remove(gpu + "/driver");
  std::filesystem::remove(node.sysfs_root() + "/bus/pci/drivers/" + driver + "/0000:3b:00.0");
  const uint64_t unbound = probe.Probe();
  EXPECT_NE(unbound, first);
  EXPECT_EQ(probe.Probe(), unbound);
  // An mdev instance appears under its type.
  const std::string types = node.sysfs_root() + "/class/mdev_bus/0000:3b:00.0/mdev_supported_types";
  const std::string type = std::filesystem::directory_iterator(types)->path().string();
  std::filesystem::create_directories(type + "/devices/4b20d080-1b54-4048-85b3-a6a62d165c01");
  const uint64_t with_mdev = probe.Probe();
  EXPECT_NE(with_mdev, unbound);
  // A function is hot-added.
  AddGpu(node.sysfs_root(), "0000:09:00.0", 90);
  EXPECT_NE(probe.Probe(), with_mdev);
}

// The kernel lists a hot-added function on the bus before it links it into its IOMMU group: the
// link appearing later changes the digest once, and the digest is stable again after it.
TEST(ChangeProbe, SeesAGroupLinkThatAppearsAfterTheFunctionIsListed) {
  FixtureNode node("vgpu");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  AddGpu(node.sysfs_root(), "0000:09:00.0", 90);
  const std::string gpu = node.sysfs_root() + "/bus/pci/devices/0000:09:00.0";
  const std::filesystem::path group = std::filesystem::read_symlink(gpu + "/iommu_group");
  std::filesystem::remove(gpu + "/iommu_group");
  ChangeProbe probe(sysfs);
  const uint64_t listed = probe.Probe();
  EXPECT_EQ(probe.ungrouped(), std::vector<std::string>{"0000:09:00.0"});
  EXPECT_EQ(probe.Probe(), listed);
  std::filesystem::create_directory_symlink(group, gpu + "/iommu_group");
  const uint64_t grouped = probe.Probe();
  EXPECT_NE(grouped, listed);
  EXPECT_EQ(probe.Probe(), grouped);
  // A new probe of the same node (a restarted daemon) sees every function grouped.
  ChangeProbe fresh(sysfs);
  fresh.Probe();
  EXPECT_TRUE(fresh.ungrouped().empty());
}

// Device taints come from files that change with no uevent and nothing else the probe reads: a
// function's fatal AER count and its PF's link state. The periodic check must see them, or a
// taint waits for the next full rescan (10 minutes).
TEST(ChangeProbe, SeesAerFatalCountsAndTheLinkOfPfsWithVfs) {
  FixtureNode node("vm-host");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  const std::string devices = node.sysfs_root() + "/bus/pci/devices/";
  const auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  };
  write(devices + "0000:5e:02.1/aer_dev_fatal", "Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n");
  write(devices + "0000:5e:00.0/net/ens1f0/operstate", "up\n");
  ChangeProbe probe(sysfs);
  const uint64_t clean = probe.Probe();
  EXPECT_EQ(probe.Probe(), clean);
  write(devices + "0000:5e:02.1/aer_dev_fatal", "Undefined 0\nDLP 1\nTOTAL_ERR_FATAL 1\n");
  const uint64_t fatal = probe.Probe();
  EXPECT_NE(fatal, clean);
  EXPECT_EQ(probe.Probe(), fatal);
  write(devices + "0000:5e:02.1/aer_dev_fatal", "Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n");
  EXPECT_EQ(probe.Probe(), clean) << "the count back to 0";
  write(devices + "0000:5e:00.0/net/ens1f0/operstate", "down\n");
  const uint64_t down = probe.Probe();
  EXPECT_NE(down, clean);
  EXPECT_EQ(probe.Probe(), down);
  write(devices + "0000:5e:00.0/net/ens1f0/operstate", "up\n");
  EXPECT_EQ(probe.Probe(), clean);
  // A netdev of a function without VFs taints nothing: its link is not read.
  write(devices + "0000:00:1f.6/net/eno1/operstate", "down\n");
  EXPECT_EQ(probe.Probe(), clean);
}

// The kernel gives an AER-capable function its counters when it adds it: the probe reads the
// counters of the functions that had them when it listed the functions (on a node of VFs without
// AER, one failed open per VF at every check otherwise), and looks again when the list changes.
TEST(ChangeProbe, ReadsAerCountsOnlyOfFunctionsThatHadThemWhenListed) {
  FixtureNode node("vm-host");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  const std::string devices = node.sysfs_root() + "/bus/pci/devices/";
  const auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  };
  const std::string clean = "Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n";
  const std::string fatal = "Undefined 0\nDLP 1\nTOTAL_ERR_FATAL 1\n";
  write(devices + "0000:5e:02.1/aer_dev_fatal", clean);
  ChangeProbe probe(sysfs);
  const uint64_t listed = probe.Probe();
  // Counters appearing on a function listed without them (no kernel does this) are not read...
  write(devices + "0000:01:00.0/aer_dev_fatal", fatal);
  EXPECT_EQ(probe.Probe(), listed);
  // ...while those of a function that had them are.
  write(devices + "0000:5e:02.1/aer_dev_fatal", fatal);
  EXPECT_NE(probe.Probe(), listed);
  write(devices + "0000:5e:02.1/aer_dev_fatal", clean);
  EXPECT_EQ(probe.Probe(), listed);
  // A changed function list looks at every function again.
  std::filesystem::remove(devices + "0000:00:1f.6");
  const uint64_t relisted = probe.Probe();
  write(devices + "0000:01:00.0/aer_dev_fatal", clean);
  EXPECT_NE(probe.Probe(), relisted);
}

// A rescan is handed on only when its fingerprint changed: the health signals must be part of
// it, or an AER count or PF link change found by the rescan the probe asked for taints nothing.
TEST(NodeScanFingerprint, FollowsAerCountsAndPfLinks) {
  FixtureNode node("vm-host");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  const std::string devices = node.sysfs_root() + "/bus/pci/devices/";
  const auto fingerprint = [&] { return Fingerprint(*ScanNode(sysfs, nullptr, AdminPolicy{})); };
  const Sha256 clean = fingerprint();
  std::ofstream(devices + "0000:01:00.0/aer_dev_fatal") << "TOTAL_ERR_FATAL 1\n";
  const Sha256 fatal = fingerprint();
  EXPECT_NE(fatal, clean);
  std::ofstream(devices + "0000:01:00.0/aer_dev_fatal") << "TOTAL_ERR_FATAL 2\n";
  EXPECT_NE(fingerprint(), fatal) << "the count is in the taint's reason";
  std::ofstream(devices + "0000:01:00.0/aer_dev_fatal") << "TOTAL_ERR_FATAL x\n";
  const Sha256 unreadable = fingerprint();
  EXPECT_NE(unreadable, fatal);
  std::filesystem::remove(devices + "0000:01:00.0/aer_dev_fatal");
  EXPECT_EQ(fingerprint(), clean);
  std::ofstream(devices + "0000:5e:00.0/net/ens1f0/operstate") << "down\n";
  EXPECT_NE(fingerprint(), clean);
  std::ofstream(devices + "0000:5e:00.0/net/ens1f0/operstate") << "up\n";
  EXPECT_EQ(fingerprint(), clean);
}

// A removal that overlapped a scan can leave a function listed but unreadable in one scan and
// off the bus in the next. Both have it missing from the functions; only the second lets a
// claim's device on it be tainted lost, so the rescan must be handed on (it was not: the e2e
// hot-remove scenario's hostdev stayed untainted).
TEST(NodeScanFingerprint, TellsAnUnreadableFunctionFromAGoneOne) {
  FixtureNode node("vm-host");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  const std::string devices = node.sysfs_root() + "/bus/pci/devices/";
  const auto scan = [&] { return ScanNode(sysfs, nullptr, AdminPolicy{}); };
  const std::string dir = std::filesystem::canonical(devices + "0000:01:00.0").string();
  std::filesystem::remove(dir + "/modalias");
  const auto unreadable = scan();
  ASSERT_EQ(unreadable->inventory.Find("0000:01:00.0"), nullptr);
  ASSERT_TRUE(unreadable->inventory.Listed("0000:01:00.0"));
  std::filesystem::remove(devices + "0000:01:00.0");
  const auto gone = scan();
  ASSERT_FALSE(gone->inventory.Listed("0000:01:00.0"));
  EXPECT_NE(Fingerprint(*gone), Fingerprint(*unreadable));
}

// Issue 58: a claim's VF bound to vfio-pci and back publishes nothing new (the scan shows it on
// its driver from before), so no scan of it may be handed on: each was a rebuild and digest of
// the whole pool in the slice sync, twice per claim. Someone else's driver on it still is.
TEST(NodeScanFingerprint, IsTheSameWhileAClaimHoldsAFunctionOnVfioPci) {
  FixtureNode node("vm-host");
  sysfs::SysfsReader sysfs(node.sysfs_root());
  testing::SimulatedKernel kernel(node.sysfs_root(), node.dir() + "/dev");
  const std::string vf = "0000:5e:02.1";
  const std::string pci = node.sysfs_root() + "/bus/pci/";
  ScanContext held;
  held.managed[vf] = {"iavf", "vfio-pci"};
  const auto fingerprint = [&](const ScanContext& context) {
    return Fingerprint(*ScanNode(sysfs, nullptr, AdminPolicy{}, context));
  };
  const Sha256 before = fingerprint({});
  ASSERT_EQ(kernel.Write(pci + "devices/" + vf + "/driver_override", "vfio-pci"), 0);
  ASSERT_EQ(kernel.Write(pci + "drivers/iavf/unbind", vf), 0);
  ASSERT_EQ(kernel.Write(pci + "drivers/vfio-pci/bind", vf), 0);
  const auto prepared = ScanNode(sysfs, nullptr, AdminPolicy{}, held);
  ASSERT_TRUE(prepared->inventory.Find(vf)->bound_by_vfio_dra);
  EXPECT_EQ(Fingerprint(*prepared), before);
  // The same function on vfio-pci without a claim is a change (its host driver is published).
  EXPECT_NE(fingerprint({}), before);
  ASSERT_EQ(kernel.Write(pci + "drivers/vfio-pci/unbind", vf), 0);
  ASSERT_EQ(kernel.Write(pci + "devices/" + vf + "/driver_override", "\n"), 0);
  ASSERT_EQ(kernel.Write(pci + "drivers/iavf/bind", vf), 0);
  EXPECT_EQ(fingerprint({}), before);
}

}  // namespace
}  // namespace vfio_dra::discovery
