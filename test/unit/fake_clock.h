// FakeClock: a Clock whose time moves only when told to, or when code under test sleeps (the
// sleep returns at once and the requested waits are recorded for assertions). A WaitUntil blocks
// until it is notified or Advance() moves the time to its deadline, so a test decides when a
// worker's timed wait ends without waiting itself.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "base/clock.h"

namespace vfio_dra::testing {

class FakeClock final : public Clock {
 public:
  TimePoint Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void SleepUntil(TimePoint deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (deadline > now_) {
      sleeps_.push_back(deadline - now_);
      now_ = deadline;
    }
  }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override {
    {
      std::lock_guard<std::mutex> guard(mu_);
      if (now_ >= deadline) return;
      waits_.push_back({&cv, lock.mutex(), deadline});
    }
    // `lock` is held from the check above until the wait releases it, and Advance notifies with
    // that mutex held: no advance between the two is missed.
    cv.wait(lock);
    std::lock_guard<std::mutex> guard(mu_);
    waits_.erase(std::find_if(waits_.begin(), waits_.end(), [&](const Wait& w) {
      return w.cv == &cv && w.deadline == deadline;
    }));
  }
  void Advance(Duration d) {
    std::vector<Wait> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now_ += d;
      for (const Wait& wait : waits_) {
        if (wait.deadline <= now_) due.push_back(wait);
      }
    }
    for (const Wait& wait : due) {
      std::lock_guard<std::mutex> lock(*wait.mu);
      wait.cv->notify_all();
    }
  }
  std::vector<Duration> sleeps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sleeps_;
  }
  // The deadlines of the timed waits in progress.
  std::vector<TimePoint> waiting_until() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<TimePoint> out;
    for (const Wait& wait : waits_) out.push_back(wait.deadline);
    return out;
  }

 private:
  struct Wait {
    std::condition_variable* cv;
    std::mutex* mu;
    TimePoint deadline;
  };
  mutable std::mutex mu_;
  TimePoint now_{std::chrono::hours(1000)};
  std::vector<Duration> sleeps_;
  std::vector<Wait> waits_;
};

}  // namespace vfio_dra::testing
