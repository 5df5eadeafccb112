#include "base/metrics.h"

#include <charconv>
#include <cmath>

namespace vfio_dra {
namespace {

std::string FormatValue(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  // The shortest text that reads back as the same double ("0.1", not "0.10000000000000001").
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return ec == std::errc() ? std::string(buffer, end) : std::string("NaN");
}

std::string LabelText(const MetricLabels& labels, const std::string& extra_name = "",
                      const std::string& extra_value = "") {
  std::string out;
  auto add = [&](const std::string& name, const std::string& value) {
    out += (out.empty() ? "{" : ",") + name + "=\"" + EscapeLabelValue(value) + "\"";
  };
  for (const auto& [name, value] : labels) add(name, value);
  if (!extra_name.empty()) add(extra_name, extra_value);
  return out.empty() ? out : out + "}";
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

const std::vector<double>& MetricsRegistry::DurationBuckets() {
  static const std::vector<double> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                               0.5,   1,      2.5,   5,    10,    30,   60};
  return kBuckets;
}

MetricsRegistry::Family& MetricsRegistry::FamilyLocked(const std::string& name, Type type) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    if (type == Type::kHistogram) it->second.buckets = DurationBuckets();
  }
  return it->second;
}

void MetricsRegistry::DeclareCounter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kCounter).help = help;
}

void MetricsRegistry::DeclareGauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kGauge).help = help;
}

void MetricsRegistry::DeclareHistogram(const std::string& name, const std::string& help,
                                       std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& family = FamilyLocked(name, Type::kHistogram);
  family.help = help;
  family.buckets = std::move(buckets);
}

void MetricsRegistry::Increment(const std::string& name, const MetricLabels& labels, double by) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kCounter).values[labels] += by;
}

void MetricsRegistry::Set(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyLocked(name, Type::kGauge).values[labels] = value;
}

void MetricsRegistry::Observe(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& family = FamilyLocked(name, Type::kHistogram);
  Histogram& h = family.histograms[labels];
  if (h.counts.empty()) h.counts.assign(family.buckets.size(), 0);
  for (size_t i = 0; i < family.buckets.size(); ++i) {
    if (value <= family.buckets[i]) {
      ++h.counts[i];
      break;
    }
  }
  ++h.count;
  h.sum += value;
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
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    static const char* kTypes[] = {"counter", "gauge", "histogram"};
    if (!family.help.empty()) out += "# HELP " + name + " " + family.help + "\n";
    out += "# TYPE " + name + " " + kTypes[static_cast<int>(family.type)] + "\n";
    if (family.type != Type::kHistogram) {
      for (const auto& [labels, value] : family.values) {
        out += name + LabelText(labels) + " " + FormatValue(value) + "\n";
      }
      continue;
    }
    for (const auto& [labels, h] : family.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < family.buckets.size(); ++i) {
        cumulative += h.counts[i];
        out += name + "_bucket" + LabelText(labels, "le", FormatValue(family.buckets[i])) + " " +
               std::to_string(cumulative) + "\n";
      }
      out +=
          name + "_bucket" + LabelText(labels, "le", "+Inf") + " " + std::to_string(h.count) + "\n";
      out += name + "_sum" + LabelText(labels) + " " + FormatValue(h.sum) + "\n";
      out += name + "_count" + LabelText(labels) + " " + std::to_string(h.count) + "\n";
    }
  }
  return out;
}

}  // namespace vfio_dra
