// FakeClock: a Clock whose time moves only when told to, or when code under test sleeps (the
// sleep returns at once and the requested waits are recorded for assertions).
#pragma once

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
  void Advance(Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }
  std::vector<Duration> sleeps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sleeps_;
  }

 private:
  mutable std::mutex mu_;
  TimePoint now_{std::chrono::hours(1000)};
  std::vector<Duration> sleeps_;
};

}  // namespace vfio_dra::testing
