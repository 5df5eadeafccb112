#include "base/clock.h"

#include <thread>

namespace vfio_dra {

Clock::TimePoint SystemClock::Now() const { return std::chrono::steady_clock::now(); }

void SystemClock::SleepUntil(TimePoint deadline) { std::this_thread::sleep_until(deadline); }

Clock& RealClock() {
  static SystemClock clock;
  return clock;
}

}  // namespace vfio_dra
