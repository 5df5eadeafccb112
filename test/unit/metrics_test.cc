// MetricsRegistry on prometheus-cpp: the page its text serializer writes (HELP/TYPE lines,
// sorted label sets, escaped label values, cumulative histogram buckets with +Inf, _sum and
// _count), sorted for stable scrapes, with declared families shown before their first sample;
// collectors run at scrape time; totals kept elsewhere exported as counters; and recordings that
// Prometheus would reject dropped without throwing.
#include "base/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace vfio_dra {
namespace {

TEST(MetricsRegistry, RendersCountersGaugesAndHistograms) {
  MetricsRegistry m;
  m.DeclareCounter("x_total", "things");
  m.Increment("x_total", {{"b", "2"}, {"a", "q\"uo\\te\n"}});
  m.Increment("x_total", {{"b", "2"}, {"a", "q\"uo\\te\n"}}, 2);
  m.Increment("x_total", {{"b", "1"}});
  m.DeclareCounter("e_total", "nothing yet");
  m.DeclareHistogram("d_seconds", "durations", {1, 0.1, 1});
  m.Observe("d_seconds", {{"op", "bind"}}, 0.05);
  m.Observe("d_seconds", {{"op", "bind"}}, 0.5);
  m.Observe("d_seconds", {{"op", "bind"}}, 5);
  int scrapes = 0;
  m.AddCollector([&](MetricsRegistry& r) { r.Set("g", {}, ++scrapes); });
  const std::string page = m.Render();
  EXPECT_EQ(page,
            "# HELP d_seconds durations\n"
            "# TYPE d_seconds histogram\n"
            "d_seconds_count{op=\"bind\"} 3\n"
            "d_seconds_sum{op=\"bind\"} 5.55\n"
            "d_seconds_bucket{op=\"bind\",le=\"0.1\"} 1\n"
            "d_seconds_bucket{op=\"bind\",le=\"1\"} 2\n"
            "d_seconds_bucket{op=\"bind\",le=\"+Inf\"} 3\n"
            "# HELP e_total nothing yet\n"
            "# TYPE e_total counter\n"
            "# TYPE g gauge\n"
            "g 1\n"
            "# HELP x_total things\n"
            "# TYPE x_total counter\n"
            "x_total{a=\"q\\\"uo\\\\te\\n\",b=\"2\"} 3\n"
            "x_total{b=\"1\"} 1\n");
  EXPECT_NE(m.Render().find("g 2\n"), std::string::npos) << "collectors run at every scrape";
}

TEST(MetricsRegistry, SetRaisesACounterAndNeverLowersIt) {
  MetricsRegistry m;
  m.DeclareCounter("writes_total", "writes");
  m.Set("writes_total", {{"op", "create"}}, 3);
  m.Set("writes_total", {{"op", "create"}}, 2);
  EXPECT_NE(m.Render().find("writes_total{op=\"create\"} 3\n"), std::string::npos);
  m.Set("writes_total", {{"op", "create"}}, 7);
  m.Increment("writes_total", {{"op", "create"}}, -1);  // counters only grow
  EXPECT_NE(m.Render().find("writes_total{op=\"create\"} 7\n"), std::string::npos);
}

TEST(MetricsRegistry, IncrementAddsToAGauge) {
  MetricsRegistry m;
  m.DeclareGauge("inflight", "calls in flight");
  m.Increment("inflight", {}, 2);
  m.Increment("inflight", {}, -1);
  EXPECT_NE(m.Render().find("\ninflight 1\n"), std::string::npos);
}

TEST(MetricsRegistry, DropsWhatPrometheusWouldRejectWithoutThrowing) {
  MetricsRegistry m;
  m.DeclareCounter("ok_total", "fine");
  m.Increment("bad name_total");
  m.Increment("ok_total", {{"bad label", "x"}});
  m.Increment("ok_total", {{"__reserved", "x"}});
  m.Observe("ok_total", {}, 1);  // a counter takes no observations
  m.DeclareGauge("ok_total", "declared again with another type");
  m.Set("ok_total", {{"fine", "yes"}}, 1);
  EXPECT_EQ(m.Render(),
            "# HELP ok_total fine\n"
            "# TYPE ok_total counter\n"
            "ok_total{fine=\"yes\"} 1\n");
}

TEST(MetricsRegistry, CountsEveryIncrementFromManyThreads) {
  MetricsRegistry m;
  m.DeclareCounter("calls_total", "calls");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 1000; ++i) {
        m.Increment("calls_total", {{"thread", std::to_string(t % 2)}});
        if (i % 100 == 0) m.Render();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const std::string page = m.Render();
  EXPECT_NE(page.find("calls_total{thread=\"0\"} 2000\n"), std::string::npos) << page;
  EXPECT_NE(page.find("calls_total{thread=\"1\"} 2000\n"), std::string::npos) << page;
}

}  // namespace
}  // namespace vfio_dra
