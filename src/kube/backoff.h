// Backoff: jittered exponential delays for retrying API calls and restarting watches, so that
// many nodes recovering from the same outage do not retry in lock-step.
#pragma once

#include <chrono>
#include <optional>
#include <random>

namespace vfio_dra::kube {

// Full jitter: each delay drawn from [0, 2 x base]. Many nodes restarting their watches after one
// API server restart then spread their re-lists over the whole window; the default 0.2 leaves them
// within a few hundred milliseconds of each other (100 instances re-listed within 0.2 s in the
// fleet benchmark, test/fleet).
inline constexpr double kFullJitter = 1.0;

class Backoff {
 public:
  // Without a seed, one from std::random_device is drawn at the first Next(): most calls never
  // retry, and need not pay for it.
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, double jitter = 0.2,
          std::optional<unsigned> seed = std::nullopt);
  // The next delay: initial * 2^n, capped at max, with +/- jitter.
  std::chrono::milliseconds Next();
  void Reset() { attempt_ = 0; }
  int attempts() const { return attempt_; }

 private:
  std::chrono::milliseconds initial_;
  std::chrono::milliseconds max_;
  double jitter_;
  int attempt_ = 0;
  std::optional<unsigned> seed_;
  std::optional<std::mt19937> rng_;
};

}  // namespace vfio_dra::kube
