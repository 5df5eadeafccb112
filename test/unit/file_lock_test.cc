// The locks and the group commit that let claims on different devices be prepared at once:
// FileLock (flock per holder, bounded waits) and GroupDirectorySync (shared directory fsyncs).
#include "base/file_lock.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "base/directory_sync.h"

namespace vfio_dra {
namespace {

using namespace std::chrono_literals;

class FileLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-lock-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/test.lock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::string path_;
};

// Each holder opens its own file description, so two threads of one process conflict exactly as
// the two instances of a rolling update do.
TEST_F(FileLockTest, ExclusiveLocksConflictWithinOneProcessAndSharedOnesCoexist) {
  auto first = FileLock::TryAcquire(path_, LockMode::kExclusive);
  ASSERT_TRUE(first.ok()) << first.error().message;
  ASSERT_TRUE(first->has_value());
  auto second = FileLock::TryAcquire(path_, LockMode::kExclusive);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->has_value()) << "one exclusive holder at a time";
  auto shared = FileLock::TryAcquire(path_, LockMode::kShared);
  ASSERT_TRUE(shared.ok());
  EXPECT_FALSE(shared->has_value()) << "no shared holder beside an exclusive one";
  first->reset();

  auto reader_a = FileLock::TryAcquire(path_, LockMode::kShared);
  auto reader_b = FileLock::TryAcquire(path_, LockMode::kShared);
  ASSERT_TRUE(reader_a.ok() && reader_b.ok());
  EXPECT_TRUE(reader_a->has_value() && reader_b->has_value()) << "shared holders coexist";
  auto writer = FileLock::TryAcquire(path_, LockMode::kExclusive);
  ASSERT_TRUE(writer.ok());
  EXPECT_FALSE(writer->has_value());
}

TEST_F(FileLockTest, AWaitEndsAtTheDeadlineNamingWhatItWaitedFor) {
  auto held = FileLock::Acquire(path_, LockMode::kExclusive, Deadline(), "the test lock");
  ASSERT_TRUE(held.ok()) << held.error().message;
  auto late =
      FileLock::Acquire(path_, LockMode::kExclusive, Deadline::After(30ms), "device 0000:01:00.0");
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_NE(late.error().message.find("for device 0000:01:00.0, and the caller's deadline passed"),
            std::string::npos)
      << late.error().message;
}

TEST_F(FileLockTest, AMissingDirectoryIsAnErrorNamingThePath) {
  auto missing = FileLock::TryAcquire(dir_ + "/absent/x.lock", LockMode::kExclusive);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(dir_ + "/absent/x.lock"), std::string::npos);
}

// A sync function the test controls: the first call blocks until released, and calls can be told
// to fail.
class ControlledSync {
 public:
  Status operator()(const std::string& dir) {
    std::unique_lock<std::mutex> lock(mu_);
    const int call = ++calls_;
    if (call == 1) {
      first_running_ = true;
      changed_.notify_all();
      changed_.wait(lock, [this] { return released_; });
    }
    if (call <= failing_calls_) {
      return MakeError(ErrorKind::kUnavailable, "cannot fsync directory " + dir + ": EIO");
    }
    return Status::Ok();
  }
  void AwaitFirstRunning() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return first_running_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }
  void FailFirst(int calls) { failing_calls_ = calls; }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int calls_ = 0;
  int failing_calls_ = 0;
  bool first_running_ = false;
  bool released_ = false;
};

// Runs one Sync in a thread that blocks in the fsync, then `waiters` more that arrive while it
// runs; returns every caller's status once all are done, the blocked caller's first.
std::vector<Status> SyncWhileOneRuns(GroupDirectorySync& sync, ControlledSync& control,
                                     int waiters) {
  std::vector<Status> results(waiters + 1, Status::Ok());
  std::vector<std::thread> threads;
  threads.emplace_back([&] { results[0] = sync.Sync(); });
  control.AwaitFirstRunning();
  for (int i = 1; i <= waiters; ++i) threads.emplace_back([&, i] { results[i] = sync.Sync(); });
  // Every waiter has asked (its ticket is drawn) before the running fsync ends.
  while (sync.requests() < static_cast<uint64_t>(waiters + 1)) std::this_thread::yield();
  control.Release();
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(GroupDirectorySync, CallersArrivingDuringAnFsyncShareTheNextOne) {
  ControlledSync control;
  GroupDirectorySync sync("/data", [&](const std::string& dir) { return control(dir); });
  const std::vector<Status> results = SyncWhileOneRuns(sync, control, 5);
  for (const Status& s : results) EXPECT_TRUE(s.ok());
  EXPECT_EQ(sync.requests(), 6u);
  // The running fsync may have begun before the waiters' renames, so it cannot cover them; one
  // more covers all five.
  EXPECT_EQ(sync.fsyncs(), 2u);
}

TEST(GroupDirectorySync, AFailedFsyncGoesToItsCallerAndTheOthersRunTheirOwn) {
  ControlledSync control;
  control.FailFirst(1);
  GroupDirectorySync sync("/data", [&](const std::string& dir) { return control(dir); });
  const std::vector<Status> results = SyncWhileOneRuns(sync, control, 3);
  ASSERT_FALSE(results[0].ok());
  EXPECT_NE(results[0].error().message.find("/data"), std::string::npos);
  for (size_t i = 1; i < results.size(); ++i) EXPECT_TRUE(results[i].ok()) << i;
  EXPECT_EQ(sync.fsyncs(), 2u);
}

TEST(GroupDirectorySync, NoCallerIsToldDurableOnTheStrengthOfAFailure) {
  ControlledSync control;
  control.FailFirst(2);
  GroupDirectorySync sync("/data", [&](const std::string& dir) { return control(dir); });
  const std::vector<Status> results = SyncWhileOneRuns(sync, control, 3);
  int failed = 0;
  for (const Status& s : results) failed += s.ok() ? 0 : 1;
  // The first fsync fails its caller; the second, covering the three waiters, fails the one that
  // ran it; the other two run a third that succeeds.
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(sync.fsyncs(), 3u);
}

TEST(GroupDirectorySync, SyncsARealDirectory) {
  char tmpl[] = "/tmp/vfio-dra-dirsync-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  GroupDirectorySync sync(dir);
  EXPECT_TRUE(sync.Sync().ok());
  GroupDirectorySync missing(dir + "/absent");
  Status failed = missing.Sync();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message.find(dir + "/absent"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vfio_dra
