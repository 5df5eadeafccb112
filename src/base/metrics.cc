#include "base/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <utility>

namespace vfio_dra {
namespace {

// prometheus-cpp reports an invalid metric or label name (and a name registered with another
// type) with std::invalid_argument. A metric must never fail the work it measures, so that is
// where its errors end: the sample is dropped.
template <typename T, typename... Args>
T* MetricOf(prometheus::Family<T>* family, const MetricLabels& labels, Args&&... args) {
  if (family == nullptr) return nullptr;
  try {
    return &family->Add(labels, std::forward<Args>(args)...);
  } catch (const std::invalid_argument&) {
    return nullptr;
  }
}

// Bucket bounds as the histogram needs them: finite (prometheus-cpp adds +Inf itself),
// ascending, each once.
std::vector<double> CleanBuckets(std::vector<double> buckets) {
  std::erase_if(buckets, [](double bound) { return !std::isfinite(bound); });
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  return buckets;
}

}  // namespace

MetricsRegistry::MetricsRegistry() : registry_(std::make_unique<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

const std::vector<double>& MetricsRegistry::DurationBuckets() {
  static const std::vector<double> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                               0.5,   1,      2.5,   5,    10,    30,   60};
  return kBuckets;
}

MetricsRegistry::Family* MetricsRegistry::FamilyLocked(const std::string& name, Type type,
                                                       const std::string& help,
                                                       std::vector<double> buckets) {
  if (auto it = families_.find(name); it != families_.end()) return &it->second;
  Family family;
  family.type = type;
  family.help = help;
  try {
    switch (type) {
      case Type::kCounter:
        family.counters = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
        break;
      case Type::kGauge:
        family.gauges = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
        break;
      case Type::kHistogram:
        family.histograms =
            &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
        family.buckets = CleanBuckets(std::move(buckets));
        break;
    }
  } catch (const std::invalid_argument&) {
    return nullptr;  // not a valid metric name: see MetricOf
  }
  return &families_.emplace(name, std::move(family)).first->second;
}

MetricsRegistry::Family* MetricsRegistry::FamilyFor(const std::string& name, Type type) {
  std::lock_guard<std::mutex> lock(mu_);
  return FamilyLocked(name, type);
}

void MetricsRegistry::DeclareCounter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kCounter, help);
}

void MetricsRegistry::DeclareGauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kGauge, help);
}

void MetricsRegistry::DeclareHistogram(const std::string& name, const std::string& help,
                                       std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kHistogram, help, std::move(buckets));
}

// The recording methods take mu_ only to find the family; prometheus-cpp's families and metrics
// lock (or are atomic) for themselves, so recordings into different families do not queue.
void MetricsRegistry::Increment(const std::string& name, const MetricLabels& labels, double by) {
  Family* family = FamilyFor(name, Type::kCounter);
  if (family == nullptr) return;
  if (family->type == Type::kCounter) {
    if (auto* counter = MetricOf(family->counters, labels)) counter->Increment(by);
  } else if (family->type == Type::kGauge) {
    if (auto* gauge = MetricOf(family->gauges, labels)) gauge->Increment(by);
  }
}

void MetricsRegistry::Set(const std::string& name, const MetricLabels& labels, double value) {
  Family* family = FamilyFor(name, Type::kGauge);
  if (family == nullptr) return;
  if (family->type == Type::kGauge) {
    if (auto* gauge = MetricOf(family->gauges, labels)) gauge->Set(value);
  } else if (family->type == Type::kCounter) {
    // A total another object keeps, read at scrape time: the counter follows it up.
    auto* counter = MetricOf(family->counters, labels);
    const double now = counter != nullptr ? counter->Value() : value;
    if (value > now) counter->Increment(value - now);
  }
}

void MetricsRegistry::Observe(const std::string& name, const MetricLabels& labels, double value) {
  Family* family = FamilyFor(name, Type::kHistogram);
  if (family == nullptr || family->type != Type::kHistogram) return;
  if (auto* histogram = MetricOf(family->histograms, labels, family->buckets)) {
    histogram->Observe(value);
  }
}

void MetricsRegistry::AddCollector(std::function<void(MetricsRegistry&)> collector) {
  std::lock_guard<std::mutex> lock(collect_mu_);
  collectors_.push_back(std::move(collector));
}

std::string MetricsRegistry::Render() {
  {
    std::lock_guard<std::mutex> lock(collect_mu_);
    for (auto& collector : collectors_) collector(*this);
  }
  // prometheus-cpp collects families by type in registration order and a family's samples in
  // hash order; sorting makes the page stable. It leaves out a family without samples: the page
  // shows it anyway (help and type), so an operator sees every family the daemon exports.
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> collected;
    for (const auto& family : families) collected.insert(family.name);
    for (const auto& [name, family] : families_) {
      if (collected.contains(name)) continue;
      static constexpr prometheus::MetricType kTypes[] = {prometheus::MetricType::Counter,
                                                          prometheus::MetricType::Gauge,
                                                          prometheus::MetricType::Histogram};
      prometheus::MetricFamily empty;
      empty.name = name;
      empty.help = family.help;
      empty.type = kTypes[static_cast<int>(family.type)];
      families.push_back(std::move(empty));
    }
  }
  std::sort(families.begin(), families.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& family : families) {
    std::sort(family.metric.begin(), family.metric.end(),
              [](const auto& a, const auto& b) { return a.label < b.label; });
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace vfio_dra
