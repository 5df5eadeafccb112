// Latency figures the benchmark programs report: milliseconds of a duration, and a sample set
// summarized as JSON (count, min, p50, p99, max) for hack/bench.sh to tabulate.
#pragma once

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <vector>

namespace vfio_dra::bench {

inline double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

inline nlohmann::json Summary(std::vector<double> samples) {
  if (samples.empty()) return {{"samples", 0}};
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
  };
  return {{"samples", samples.size()},
          {"min_ms", samples.front()},
          {"p50_ms", at(0.50)},
          {"p99_ms", at(0.99)},
          {"max_ms", samples.back()}};
}

}  // namespace vfio_dra::bench
