// Prometheus' naming rules for metric and label names
// (https://prometheus.io/docs/concepts/data_model/#metric-names-and-labels).
#pragma once

#include <string>

#include "util/status.h"

namespace qpool {

// OK when `name` matches [a-zA-Z_][a-zA-Z0-9_]*; colons are valid in Prometheus but reserved
// for recording rules, so exporters (we) may not use them. InvalidArgument says why not.
Status ValidateMetricName(const std::string& name);

// OK when `name` matches [a-zA-Z_][a-zA-Z0-9_]* and does not start with "__" (reserved for
// Prometheus' internal labels). InvalidArgument says why not.
Status ValidateLabelName(const std::string& name);

}  // namespace qpool
