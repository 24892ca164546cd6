// Reading one sample of a registry's scrape in tests of code that records metrics.
#pragma once

#include <cmath>
#include <string>

#include "metrics/metrics_registry.h"

namespace qpool::testing {

// The value of sample `name` (a family name plus its suffix, e.g. "x_count") with exactly
// `labels` (a bucket's `le` last), or NaN when the scrape has no such sample.
inline double SampleValue(const MetricsRegistry& registry, const std::string& name,
                          const MetricLabels& labels) {
  for (const FamilySnapshot& family : registry.Collect()) {
    for (const MetricSample& sample : family.samples) {
      if (family.name + sample.suffix == name && sample.labels == labels) return sample.value;
    }
  }
  return NAN;
}

}  // namespace qpool::testing
