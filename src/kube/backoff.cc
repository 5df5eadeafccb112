#include "kube/backoff.h"

#include <algorithm>
#include <cstdint>

namespace vfio_dra::kube {

Backoff::Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max, double jitter,
                 std::optional<unsigned> seed)
    : initial_(initial), max_(max), jitter_(jitter), seed_(seed) {}

std::chrono::milliseconds Backoff::Next() {
  double base = static_cast<double>(initial_.count());
  for (int i = 0; i < attempt_ && base < static_cast<double>(max_.count()); ++i) base *= 2;
  base = std::min(base, static_cast<double>(max_.count()));
  ++attempt_;
  if (!rng_) rng_.emplace(seed_ ? *seed_ : std::random_device{}());
  std::uniform_real_distribution<double> dist(1.0 - jitter_, 1.0 + jitter_);
  return std::chrono::milliseconds(static_cast<int64_t>(base * dist(*rng_)));
}

}  // namespace vfio_dra::kube
