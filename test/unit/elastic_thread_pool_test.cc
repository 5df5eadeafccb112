// ElasticThreadPool: tasks run on reused threads, a blocked task never holds up another, idle
// threads end, and a pool that goes leaves its running tasks to finish.
#include "base/elastic_thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace vfio_dra {
namespace {

using std::chrono::milliseconds;
constexpr auto kPatience = std::chrono::seconds(60);

// Polls `done` until it holds or kPatience passes (the pool's state changes on its own threads).
template <typename Done>
bool Eventually(Done done) {
  const auto until = std::chrono::steady_clock::now() + kPatience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(ElasticThreadPool, AnIdleThreadTakesTheNextTask) {
  ElasticThreadPool pool("test-pool", std::chrono::seconds(60));
  std::promise<void> first;
  pool.Run([&] { first.set_value(); });
  first.get_future().wait();
  ASSERT_TRUE(Eventually([&] { return pool.Idle() == 1; }));
  std::promise<void> second;
  pool.Run([&] { second.set_value(); });
  second.get_future().wait();
  EXPECT_EQ(pool.Threads(), 1u);
  EXPECT_TRUE(Eventually([&] { return pool.Idle() == 1; }));
}

TEST(ElasticThreadPool, ABlockedTaskDoesNotHoldUpAnother) {
  ElasticThreadPool pool("test-pool", std::chrono::seconds(60));
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> blocked_started;
  pool.Run([&, released] {
    blocked_started.set_value();
    released.wait();
  });
  blocked_started.get_future().wait();
  std::promise<void> other;
  pool.Run([&] { other.set_value(); });
  EXPECT_EQ(other.get_future().wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(pool.Threads(), 2u);
  release.set_value();
  // Both tasks are over before what they use goes.
  EXPECT_TRUE(Eventually([&] { return pool.Idle() == 2; }));
}

TEST(ElasticThreadPool, IdleThreadsEndAndWhatATaskHeldIsReleased) {
  ElasticThreadPool pool("test-pool", milliseconds(20));
  auto held = std::make_shared<int>(0);
  std::weak_ptr<int> watch = held;
  std::promise<void> ran;
  pool.Run([&ran, held = std::move(held)] { ran.set_value(); });
  ran.get_future().wait();
  EXPECT_TRUE(Eventually([&] { return watch.expired(); }));
  EXPECT_TRUE(Eventually([&] { return pool.Threads() == 0; }));
}

TEST(ElasticThreadPool, ARunningTaskFinishesAfterThePoolIsGone) {
  // Shared with the task, which outlives the pool and may still be in set_value when the test
  // has its answer.
  auto release = std::make_shared<std::promise<void>>();
  auto started = std::make_shared<std::promise<void>>();
  auto finished = std::make_shared<std::promise<void>>();
  std::future<void> finished_future = finished->get_future();
  {
    ElasticThreadPool pool("test-pool", std::chrono::seconds(60));
    pool.Run([release_future = release->get_future().share(), started, finished] {
      started->set_value();
      release_future.wait();
      finished->set_value();
    });
    started->get_future().wait();
  }
  release->set_value();
  EXPECT_EQ(finished_future.wait_for(kPatience), std::future_status::ready);
}

TEST(ElasticThreadPool, ManyTasksAllRun) {
  ElasticThreadPool pool("test-pool", std::chrono::seconds(60));
  std::atomic<int> count{0};
  std::promise<void> all;
  constexpr int kTasks = 200;
  for (int i = 0; i < kTasks; ++i) {
    pool.Run([&] {
      if (++count == kTasks) all.set_value();
    });
  }
  EXPECT_EQ(all.get_future().wait_for(kPatience), std::future_status::ready);
  EXPECT_LE(pool.Threads(), static_cast<size_t>(kTasks));
  EXPECT_TRUE(Eventually([&] { return pool.Idle() == pool.Threads(); }));
}

}  // namespace
}  // namespace vfio_dra
