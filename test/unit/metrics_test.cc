// The Prometheus text format as scrapers parse it: HELP/TYPE lines, sorted label sets, escaped
// label values, cumulative histogram buckets with +Inf, _sum and _count, and collectors run at
// scrape time.
#include "base/metrics.h"

#include <gtest/gtest.h>

namespace vfio_dra {
namespace {

TEST(MetricsRegistry, RendersCountersGaugesAndHistograms) {
  MetricsRegistry m;
  m.DeclareCounter("x_total", "things");
  m.Increment("x_total", {{"b", "2"}, {"a", "q\"uo\\te\n"}});
  m.Increment("x_total", {{"b", "2"}, {"a", "q\"uo\\te\n"}}, 2);
  m.DeclareHistogram("d_seconds", "durations", {0.1, 1});
  m.Observe("d_seconds", {{"op", "bind"}}, 0.05);
  m.Observe("d_seconds", {{"op", "bind"}}, 0.5);
  m.Observe("d_seconds", {{"op", "bind"}}, 5);
  int scrapes = 0;
  m.AddCollector([&](MetricsRegistry& r) { r.Set("g", {}, ++scrapes); });
  const std::string page = m.Render();
  EXPECT_EQ(page,
            "# HELP d_seconds durations\n"
            "# TYPE d_seconds histogram\n"
            "d_seconds_bucket{op=\"bind\",le=\"0.1\"} 1\n"
            "d_seconds_bucket{op=\"bind\",le=\"1\"} 2\n"
            "d_seconds_bucket{op=\"bind\",le=\"+Inf\"} 3\n"
            "d_seconds_sum{op=\"bind\"} 5.55\n"
            "d_seconds_count{op=\"bind\"} 3\n"
            "# TYPE g gauge\n"
            "g 1\n"
            "# HELP x_total things\n"
            "# TYPE x_total counter\n"
            "x_total{a=\"q\\\"uo\\\\te\\n\",b=\"2\"} 3\n");
  EXPECT_NE(m.Render().find("g 2\n"), std::string::npos) << "collectors run at every scrape";
}

}  // namespace
}  // namespace vfio_dra
