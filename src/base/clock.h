// Clock: the daemon's only source of time, so that tests can drive time-dependent logic
// (rate limits, token reloads, deadlines) without real waiting.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace vfio_dra {

class Clock {
 public:
  using Duration = std::chrono::steady_clock::duration;
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Blocks the calling thread until the clock reaches `deadline`.
  virtual void SleepUntil(TimePoint deadline) = 0;
  // Waits on `cv` (with `lock`, which holds its mutex) until it is notified or the clock reaches
  // `deadline`; it may also return early, so the caller re-checks its condition. Unlike
  // SleepUntil, a waiter can be woken: a worker waiting for its next retry still stops at once.
  virtual void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         TimePoint deadline) = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint Now() const override;
  void SleepUntil(TimePoint deadline) override;
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) override;
};

// The process-wide real clock; stateless, so sharing it introduces no mutable global state.
Clock& RealClock();

}  // namespace vfio_dra
