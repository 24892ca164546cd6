#include "metrics/metric_family.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "metrics/metric_names.h"
#include "metrics/text_exposition.h"

namespace qpool {

// Note [Metric hot paths]
// Counter::Inc, Gauge::Set/Inc and Histogram::Observe run on request and allocator paths, so
// they are lock-free: one relaxed atomic per value (a compare-exchange loop for doubles, as
// std::atomic<double>::fetch_add is C++20). A scrape reads the atomics one by one, so it may
// see an observation in a histogram's sum but not yet in its bucket; that skew is one event
// and disappears at the next scrape. `_count` is computed from the buckets at scrape time, so
// it always equals the `le="+Inf"` bucket, which Prometheus' histogram functions rely on.
// Finding a series by label values takes the family's mutex: callers keep the reference.
namespace {

void AtomicAdd(std::atomic<double>& target, double amount) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
  }
}

MetricLabels WithLabel(const MetricLabels& labels, std::string name, std::string value) {
  MetricLabels out = labels;
  out.emplace_back(std::move(name), std::move(value));
  return out;
}

}  // namespace

void Counter::Inc(double amount) {
  if (!(amount >= 0)) return;  // also rejects NaN
  AtomicAdd(value_, amount);
}

void Counter::AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const {
  out->push_back({"", labels, value()});
}

void Gauge::Inc(double amount) { AtomicAdd(value_, amount); }

void Gauge::AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const {
  out->push_back({"", labels, value()});
}

Histogram::Histogram(const std::vector<double>* upper_bounds)
    : upper_bounds_(*upper_bounds), counts_(new std::atomic<uint64_t>[upper_bounds->size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t bucket = upper_bounds_.size();  // +Inf, also for NaN
  if (!std::isnan(value)) {
    bucket =
        std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  }
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> counts(upper_bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = counts_[i].load(std::memory_order_relaxed);
  return counts;
}

void Histogram::AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const {
  const std::vector<uint64_t> counts = bucket_counts();
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    const std::string le = i < upper_bounds_.size() ? FormatMetricValue(upper_bounds_[i]) : "+Inf";
    out->push_back({"_bucket", WithLabel(labels, "le", le), static_cast<double>(cumulative)});
  }
  out->push_back({"_sum", labels, sum()});
  out->push_back({"_count", labels, static_cast<double>(cumulative)});
}

MetricFamily::MetricFamily(std::string name, std::string help, MetricType type,
                           std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {
  Status status = ValidateMetricName(name_);
  if (!status.ok()) throw std::invalid_argument(status.message());
  if (help_.empty()) throw std::invalid_argument(name_ + ": help text is empty");
  std::set<std::string> seen;
  for (const std::string& label : label_names_) {
    status = ValidateLabelName(label);
    if (!status.ok()) throw std::invalid_argument(name_ + ": " + status.message());
    if (!seen.insert(label).second) {
      throw std::invalid_argument(name_ + ": label name '" + label + "' is repeated");
    }
  }
}

void MetricFamily::CheckArity(const std::vector<std::string>& label_values) const {
  if (label_values.size() == label_names_.size()) return;
  std::string names;
  for (const std::string& label : label_names_) names += (names.empty() ? "" : ", ") + label;
  throw std::invalid_argument(name_ + " has " + std::to_string(label_names_.size()) +
                              " label(s) {" + names + "} but got " +
                              std::to_string(label_values.size()) + " value(s)");
}

MetricSeries& MetricFamily::Series(const std::vector<std::string>& label_values) {
  CheckArity(label_values);
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<MetricSeries>& series = series_[label_values];
  if (!series) series = NewSeries();
  return *series;
}

bool MetricFamily::Remove(const std::vector<std::string>& label_values) {
  CheckArity(label_values);
  std::lock_guard<std::mutex> lock(mu_);
  return series_.erase(label_values) > 0;
}

size_t MetricFamily::series_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return series_.size();
}

FamilySnapshot MetricFamily::Snapshot() const {
  FamilySnapshot snapshot{name_, help_, type_, {}};
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, series] : series_) {
    MetricLabels labels;
    labels.reserve(values.size());
    for (size_t i = 0; i < values.size(); ++i) labels.emplace_back(label_names_[i], values[i]);
    series->AppendSamples(labels, &snapshot.samples);
  }
  return snapshot;
}

bool MetricFamily::SameDefinition(const MetricFamily& other) const {
  return name_ == other.name_ && help_ == other.help_ && type_ == other.type_ &&
         label_names_ == other.label_names_;
}

CounterFamily::CounterFamily(std::string name, std::string help,
                             std::vector<std::string> label_names)
    : MetricFamily(std::move(name), std::move(help), MetricType::kCounter, std::move(label_names)) {
  if (this->label_names().empty()) Series({});
}

std::unique_ptr<MetricSeries> CounterFamily::NewSeries() const {
  return std::make_unique<Counter>();
}

GaugeFamily::GaugeFamily(std::string name, std::string help, std::vector<std::string> label_names)
    : MetricFamily(std::move(name), std::move(help), MetricType::kGauge, std::move(label_names)) {
  if (this->label_names().empty()) Series({});
}

std::unique_ptr<MetricSeries> GaugeFamily::NewSeries() const { return std::make_unique<Gauge>(); }

HistogramFamily::HistogramFamily(std::string name, std::string help,
                                 std::vector<std::string> label_names,
                                 std::vector<double> upper_bounds)
    : MetricFamily(std::move(name), std::move(help), MetricType::kHistogram,
                   std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {
  for (const std::string& label : this->label_names()) {
    if (label == "le") {
      throw std::invalid_argument(this->name() + ": label name 'le' is reserved for buckets");
    }
  }
  if (!upper_bounds_.empty() && upper_bounds_.back() == INFINITY) upper_bounds_.pop_back();
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    const bool increasing = i == 0 || upper_bounds_[i] > upper_bounds_[i - 1];
    if (std::isnan(upper_bounds_[i]) || upper_bounds_[i] == INFINITY || !increasing) {
      throw std::invalid_argument(this->name() +
                                  ": bucket bounds must be strictly increasing numbers");
    }
  }
  if (this->label_names().empty()) Series({});
}

std::unique_ptr<MetricSeries> HistogramFamily::NewSeries() const {
  return std::make_unique<Histogram>(&upper_bounds_);
}

bool HistogramFamily::SameDefinition(const MetricFamily& other) const {
  if (!MetricFamily::SameDefinition(other)) return false;
  return upper_bounds_ == static_cast<const HistogramFamily&>(other).upper_bounds_;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    throw std::invalid_argument("ExponentialBuckets needs start > 0, factor > 1, count >= 1");
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i, start *= factor) bounds.push_back(start);
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  if (!(width > 0) || count < 1) {
    throw std::invalid_argument("LinearBuckets needs width > 0, count >= 1");
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) bounds.push_back(start + i * width);
  return bounds;
}

}  // namespace qpool
