#include "base/clock.h"

#include <thread>

namespace vfio_dra {

Clock::TimePoint SystemClock::Now() const { return std::chrono::steady_clock::now(); }

void SystemClock::SleepUntil(TimePoint deadline) { std::this_thread::sleep_until(deadline); }

void SystemClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                            TimePoint deadline) {
  cv.wait_until(lock, deadline);
}

Clock& RealClock() {
  static SystemClock clock;
  return clock;
}

}  // namespace vfio_dra
