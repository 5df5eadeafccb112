#include "kube/rate_limiter.h"

#include <algorithm>

namespace vfio_dra::kube {

RateLimiter::RateLimiter(double qps, int burst, Clock& clock)
    : qps_(qps), burst_(std::max(1, burst)), clock_(clock), tokens_(burst_), last_(clock.Now()) {}

Clock::TimePoint RateLimiter::Reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = clock_.Now();
  if (qps_ <= 0) return now;  // unlimited
  const double elapsed = std::chrono::duration<double>(now - last_).count();
  if (elapsed > 0) {
    tokens_ = std::min(burst_, tokens_ + elapsed * qps_);
    last_ = now;
  }
  tokens_ -= 1.0;
  if (tokens_ >= 0) return now;
  // The bucket is in debt: this reservation becomes usable once the debt is paid back.
  const auto wait = std::chrono::duration<double>(-tokens_ / qps_);
  return now + std::chrono::duration_cast<Clock::Duration>(wait);
}

void RateLimiter::Acquire() {
  const auto at = Reserve();
  if (at > clock_.Now()) clock_.SleepUntil(at);
}

}  // namespace vfio_dra::kube
