// Metrics: the daemon's counters, gauges and histograms with labels, kept in a prometheus-cpp
// registry (prometheus::Registry and its metric families) and rendered with prometheus-cpp's text
// serializer (exposition format 0.0.4). This class is the one place the modules record through:
// they name a family and its labels, and need neither prometheus-cpp's headers nor references to
// its metric objects. Values that other objects already keep (slice statistics, checkpoint
// entries) are read at scrape time through collectors instead of being copied.
//
// Invariants: a family's type, help text and histogram buckets are fixed when it is first
// declared or recorded into (declare before recording; the daemon declares its whole catalog at
// start). Recording never throws and never fails the caller's work: a sample its family's type
// cannot take (an observation on a counter), or whose metric or label name Prometheus would
// reject, is dropped. The registry is an object its owner (the daemon) keeps; there is no
// process-wide registry. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace vfio_dra {

using MetricLabels = std::map<std::string, std::string>;

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Default buckets for operation durations, in seconds (1 ms .. 60 s).
  static const std::vector<double>& DurationBuckets();

  // Declares a family (its help text and type); recording into an undeclared family declares it
  // with an empty help text. Buckets are sorted, and repeated bounds dropped, before use.
  void DeclareCounter(const std::string& name, const std::string& help);
  void DeclareGauge(const std::string& name, const std::string& help);
  void DeclareHistogram(const std::string& name, const std::string& help,
                        std::vector<double> buckets = DurationBuckets());

  // Increment adds to a counter (a negative amount is ignored: counters only grow) or a gauge.
  void Increment(const std::string& name, const MetricLabels& labels = {}, double by = 1);
  // Set sets a gauge. On a counter it raises the counter to `value` (never lowers it): collectors
  // use it to export totals that another object counts, such as slice writes.
  void Set(const std::string& name, const MetricLabels& labels, double value);
  void Observe(const std::string& name, const MetricLabels& labels, double value);

  // A collector runs at every scrape, before rendering, and sets gauges from live state.
  void AddCollector(std::function<void(MetricsRegistry&)> collector);

  // The page Prometheus scrapes: families sorted by name, samples by their labels, so two
  // scrapes of the same state read the same.
  std::string Render();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type = Type::kCounter;
    std::string help;
    prometheus::Family<prometheus::Counter>* counters = nullptr;
    prometheus::Family<prometheus::Gauge>* gauges = nullptr;
    prometheus::Family<prometheus::Histogram>* histograms = nullptr;
    std::vector<double> buckets;
  };
  // The family `name` (of whatever type it has), registered with `type` when new; null when the
  // name is not a valid metric name. Families are never removed, so the pointer stays valid.
  Family* FamilyLocked(const std::string& name, Type type, const std::string& help = "",
                       std::vector<double> buckets = DurationBuckets());
  Family* FamilyFor(const std::string& name, Type type);  // FamilyLocked under mu_

  std::unique_ptr<prometheus::Registry> registry_;
  std::mutex mu_;  // guards families_ (prometheus-cpp's families lock for themselves)
  std::map<std::string, Family> families_;
  std::vector<std::function<void(MetricsRegistry&)>> collectors_;
  std::mutex collect_mu_;  // one scrape's collectors at a time
};

}  // namespace vfio_dra
