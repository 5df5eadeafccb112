// Deadline: the moment a caller stops waiting for an answer (the kubelet's gRPC deadline for a
// NodePrepareResources call). Work done for that caller checks it between steps and bounds every
// wait by it, so an answer (even an error) reaches the caller before it gives up, and no work
// continues for a caller that is gone. A default-constructed Deadline never expires.
#pragma once

#include <algorithm>
#include <chrono>

namespace vfio_dra {

class Deadline {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  Deadline() = default;
  explicit Deadline(TimePoint at) : at_(at) {}
  static Deadline After(std::chrono::steady_clock::duration duration) {
    return Deadline(std::chrono::steady_clock::now() + duration);
  }

  bool IsSet() const { return at_ != TimePoint::max(); }
  TimePoint at() const { return at_; }
  bool Expired(TimePoint now = std::chrono::steady_clock::now()) const { return now >= at_; }
  // What is left from `now`, at most `cap` and never negative.
  std::chrono::milliseconds RemainingOr(std::chrono::milliseconds cap,
                                        TimePoint now = std::chrono::steady_clock::now()) const {
    if (!IsSet()) return cap;
    if (now >= at_) return std::chrono::milliseconds(0);
    return std::min(cap, std::chrono::duration_cast<std::chrono::milliseconds>(at_ - now));
  }
  // The earlier of the two.
  Deadline Min(Deadline other) const { return Deadline(std::min(at_, other.at_)); }

 private:
  TimePoint at_ = TimePoint::max();
};

}  // namespace vfio_dra
