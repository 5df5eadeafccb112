// Backoff: jittered exponential delays for retrying API calls and restarting watches, so that
// many nodes recovering from the same outage do not retry in lock-step.
#pragma once

#include <chrono>
#include <random>

namespace vfio_dra::kube {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, double jitter = 0.2,
          unsigned seed = std::random_device{}());
  // The next delay: initial * 2^n, capped at max, with +/- jitter.
  std::chrono::milliseconds Next();
  void Reset() { attempt_ = 0; }
  int attempts() const { return attempt_; }

 private:
  std::chrono::milliseconds initial_;
  std::chrono::milliseconds max_;
  double jitter_;
  int attempt_ = 0;
  std::mt19937 rng_;
};

}  // namespace vfio_dra::kube
