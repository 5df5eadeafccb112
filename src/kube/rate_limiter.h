// RateLimiter: the client-side token bucket (QPS with a burst) that keeps one node's daemon from
// flooding the API server, as client-go does by default (5 QPS, burst 10).
#pragma once

#include <mutex>

#include "base/clock.h"

namespace vfio_dra::kube {

class RateLimiter {
 public:
  RateLimiter(double qps, int burst, Clock& clock);
  // Reserves one token and returns when the caller may send. Reservations are granted in order.
  void Acquire();
  // Reserves one token and returns the time at which it may be used (for tests and callers that
  // want to wait on something else meanwhile).
  Clock::TimePoint Reserve();

 private:
  const double qps_;
  const double burst_;
  Clock& clock_;
  std::mutex mu_;
  double tokens_;
  Clock::TimePoint last_;
};

}  // namespace vfio_dra::kube
