#include "metrics/text_exposition.h"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace qpool {

// Note [Metric value format]
// Prometheus parses sample values with Go's strconv.ParseFloat, so any round-trip form works;
// we choose the one a person reads best. Byte counts and event counts are integers that a
// double holds exactly up to 2^53, and "%g"-style output would turn 8589934592 into
// "8.589934592e+09", so exact integers in that range print as integers. Everything else uses
// std::to_chars' shortest round-trip form, which does not depend on the C locale (LibTorch or
// a library may call setlocale, after which printf could write "0,5").
std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53
  if (value == std::trunc(value) && std::fabs(value) <= kMaxExactInteger) {
    return std::to_string(static_cast<int64_t>(value));  // also turns -0 into "0"
  }
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
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

std::string ExposeText(const std::vector<FamilySnapshot>& families) {
  std::string out;
  for (const FamilySnapshot& family : families) {
    if (family.samples.empty()) continue;
    out += "# HELP " + family.name + " " + EscapeHelp(family.help) + "\n";
    out += "# TYPE " + family.name + " " + MetricTypeName(family.type) + "\n";
    for (const MetricSample& sample : family.samples) {
      out += family.name;
      out += sample.suffix;
      if (!sample.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < sample.labels.size(); ++i) {
          if (i > 0) out += ',';
          out += sample.labels[i].first + "=\"" + EscapeLabelValue(sample.labels[i].second) + "\"";
        }
        out += '}';
      }
      out += ' ';
      out += FormatMetricValue(sample.value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace qpool
