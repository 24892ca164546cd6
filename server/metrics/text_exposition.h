// Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "metrics/metric_snapshot.h"

namespace qpool {

// The Content-Type of ExposeText's output, as Prometheus expects it on /metrics.
inline constexpr char kMetricsTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// A sample value or bucket bound: integers up to 2^53 in magnitude without exponent or ".0"
// ("1073741824"), others in the shortest form that reads back exactly ("0.25", "1e+300"),
// and "NaN", "+Inf", "-Inf" as Prometheus spells them.
std::string FormatMetricValue(double value);
// HELP text with backslash and newline escaped ("\\", "\n").
std::string EscapeHelp(std::string_view help);
// A label value with backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view value);
// `# HELP`, `# TYPE` and sample lines of each family in the given order; families without
// samples are left out. MetricsRegistry::Collect returns families sorted by name.
std::string ExposeText(const std::vector<FamilySnapshot>& families);

}  // namespace qpool
