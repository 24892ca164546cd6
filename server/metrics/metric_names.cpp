#include "metrics/metric_names.h"

namespace qpool {
namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// "" when `name` matches [a-zA-Z_][a-zA-Z0-9_]*, else the reason.
std::string NameProblem(const std::string& name) {
  if (name.empty()) return "is empty";
  if (!IsNameStart(name[0])) return "must start with a letter or '_'";
  for (char c : name) {
    if (c == ':') return "uses ':', which is reserved for recording rules";
    if (!IsNameChar(c)) return "may contain only letters, digits and '_'";
  }
  return "";
}

}  // namespace

Status ValidateMetricName(const std::string& name) {
  const std::string problem = NameProblem(name);
  if (problem.empty()) return Status::Ok();
  return InvalidArgument("metric name '" + name + "' " + problem);
}

Status ValidateLabelName(const std::string& name) {
  std::string problem = NameProblem(name);
  if (problem.empty() && name.rfind("__", 0) == 0) {
    problem = "starts with '__', which is reserved for Prometheus' own labels";
  }
  if (problem.empty()) return Status::Ok();
  return InvalidArgument("label name '" + name + "' " + problem);
}

}  // namespace qpool
