// Plain values of one scrape: what MetricsRegistry::Collect hands to the text exposition. No
// locks, no atomics; a snapshot is a copy.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace qpool {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as the `# TYPE` line spells it.
inline const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// Label name/value pairs of one series, in the order they are written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// One sample line: `<family name><suffix>{labels} value`. The suffix is "" for counters and
// gauges and "_bucket", "_sum" or "_count" for histograms (`le` is the last of `labels`).
struct MetricSample {
  std::string suffix;
  MetricLabels labels;
  double value = 0;
};

// One family: its `# HELP` and `# TYPE` lines and its samples, in exposition order.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<MetricSample> samples;
};

}  // namespace qpool
