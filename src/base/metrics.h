// Metrics: counters, gauges and histograms with labels, rendered in the Prometheus text
// exposition format (version 0.0.4). prometheus-cpp is not packaged for Debian 12, and what the
// daemon needs is small: a registry the modules record into and one page rendered on scrape.
// Values that other objects already keep (slice statistics, checkpoint entries) are read at
// scrape time through collectors instead of being copied. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace vfio_dra {

using MetricLabels = std::map<std::string, std::string>;

class MetricsRegistry {
 public:
  // Default buckets for operation durations, in seconds (1 ms .. 60 s).
  static const std::vector<double>& DurationBuckets();

  // Declares a family (its help text and type); recording into an undeclared family declares it
  // with an empty help text.
  void DeclareCounter(const std::string& name, const std::string& help);
  void DeclareGauge(const std::string& name, const std::string& help);
  void DeclareHistogram(const std::string& name, const std::string& help,
                        std::vector<double> buckets = DurationBuckets());

  void Increment(const std::string& name, const MetricLabels& labels = {}, double by = 1);
  void Set(const std::string& name, const MetricLabels& labels, double value);
  void Observe(const std::string& name, const MetricLabels& labels, double value);

  // A collector runs at every scrape, before rendering, and sets gauges from live state.
  void AddCollector(std::function<void(MetricsRegistry&)> collector);

  std::string Render();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket, not cumulative
    uint64_t count = 0;
    double sum = 0;
  };
  struct Family {
    Type type = Type::kCounter;
    std::string help;
    std::vector<double> buckets;
    std::map<MetricLabels, double> values;
    std::map<MetricLabels, Histogram> histograms;
  };
  Family& FamilyLocked(const std::string& name, Type type);

  std::mutex mu_;
  std::map<std::string, Family> families_;
  std::vector<std::function<void(MetricsRegistry&)>> collectors_;
  std::mutex collect_mu_;  // one scrape's collectors at a time
};

// Escapes a label value for the exposition format (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& value);

}  // namespace vfio_dra
