#include "discovery/device_watcher.h"

#include <gtest/gtest.h>

#include <condition_variable>

#include "unit/fixture_node.h"

namespace vfio_dra::discovery {
namespace {

using vfio_dra::testing::FixtureNode;
using vfio_dra::testing::SysfsFixture;

// Counts scans and handed-on results, and lets the test wait for either.
class Recorder {
 public:
  std::shared_ptr<const NodeScan> Scan(const SysfsReader& sysfs) {
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
  SysfsReader sysfs(node.sysfs_root());
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
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(2));
  EXPECT_EQ(recorder.last()->selection.devices.size(), 3u);
  watcher.Stop();
}

TEST(DeviceWatcher, ThePeriodicRescanCatchesMissedEvents) {
  FixtureNode node("workstation");
  SysfsReader sysfs(node.sysfs_root());
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
  EXPECT_EQ(watcher.Latest(), recorder.last());
}

}  // namespace
}  // namespace vfio_dra::discovery
