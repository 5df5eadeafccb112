// Latency figures the benchmark programs report: milliseconds of a duration, the latencies of
// calls made at once, and a sample set summarized as JSON (count, min, p50, p99, max) for
// hack/bench.sh to tabulate.
#pragma once

#include <algorithm>
#include <chrono>
#include <latch>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace vfio_dra::bench {

inline double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Runs `one(i)` for i in [0, pods) at once, each on its own thread released together; returns
// each call's latency in milliseconds.
template <typename One>
std::vector<double> AtOnce(int pods, One one) {
  std::vector<double> round(static_cast<size_t>(pods));
  std::latch start(pods);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(pods));
  for (int i = 0; i < pods; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      one(i);
      round[static_cast<size_t>(i)] = Ms(std::chrono::steady_clock::now() - t0);
    });
  }
  for (auto& t : threads) t.join();
  return round;
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
