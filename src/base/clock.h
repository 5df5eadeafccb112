// Clock: the daemon's only source of time, so that tests can drive time-dependent logic
// (rate limits, token reloads, deadlines) without real waiting.
#pragma once

#include <chrono>

namespace vfio_dra {

class Clock {
 public:
  using Duration = std::chrono::steady_clock::duration;
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Blocks the calling thread until the clock reaches `deadline`.
  virtual void SleepUntil(TimePoint deadline) = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint Now() const override;
  void SleepUntil(TimePoint deadline) override;
};

// The process-wide real clock; stateless, so sharing it introduces no mutable global state.
Clock& RealClock();

}  // namespace vfio_dra
