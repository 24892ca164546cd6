// Metric families and their series: Counter, Gauge, Histogram, one per label-value tuple of a
// family. Families are made by MetricsRegistry (metrics_registry.h), which owns them.
//
// Thread safety: Counter, Gauge and Histogram methods are lock-free and may be called from any
// thread (Note [Metric hot paths]). WithLabels, Remove and Snapshot take the family's mutex;
// look a series up once and keep the reference rather than calling WithLabels per event.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/metric_snapshot.h"

namespace qpool {

// One time series of a family; the base only lets the family snapshot its series.
class MetricSeries {
 public:
  virtual ~MetricSeries() = default;
  // Appends this series' samples, each labelled with `labels` (the family's names and values).
  virtual void AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const = 0;
};

// A value that only goes up (requests, bytes moved). Reset only by a process restart.
class Counter final : public MetricSeries {
 public:
  // Adds `amount`; negative and NaN amounts are ignored (a counter never goes down).
  void Inc(double amount = 1);
  // The current total.
  double value() const { return value_.load(std::memory_order_relaxed); }
  void AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const override;

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (bytes resident, requests in flight).
class Gauge final : public MetricSeries {
 public:
  // Replaces the value.
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  // Adds `amount` (may be negative).
  void Inc(double amount = 1);
  // Subtracts `amount`.
  void Dec(double amount = 1) { Inc(-amount); }
  // The current value.
  double value() const { return value_.load(std::memory_order_relaxed); }
  void AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const override;

 private:
  std::atomic<double> value_{0};
};

// Counts observations into buckets by upper bound (`le`), plus their sum and count.
class Histogram final : public MetricSeries {
 public:
  // `upper_bounds` (strictly increasing, no +Inf) must outlive the histogram (the family's).
  explicit Histogram(const std::vector<double>* upper_bounds);
  // Counts `value` in the first bucket whose bound is >= value (NaN goes to +Inf only).
  void Observe(double value);
  // Per-bucket counts (not cumulative), one per bound plus the +Inf bucket.
  std::vector<uint64_t> bucket_counts() const;
  // The sum of all observed values.
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  void AppendSamples(const MetricLabels& labels, std::vector<MetricSample>* out) const override;

 private:
  const std::vector<double>& upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // upper_bounds_.size() + 1 entries
  std::atomic<double> sum_{0};
};

// Name, help, label names and the series by label values. Subclasses add typed WithLabels.
class MetricFamily {
 public:
  // Throws std::invalid_argument for a bad metric name, empty help, a bad or repeated label.
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names);
  virtual ~MetricFamily() = default;
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Drops the series with these label values (e.g. of an unloaded pipeline); false when there
  // was none. References to it dangle afterwards: its owner must have stopped using it.
  // Throws std::invalid_argument when the number of values differs from label_names().
  bool Remove(const std::vector<std::string>& label_values);
  // How many series the family has.
  size_t series_count() const;
  // HELP, TYPE and all samples; series ordered by label values.
  FamilySnapshot Snapshot() const;
  // True when `other` was registered with the same name, help, type, labels (and buckets).
  virtual bool SameDefinition(const MetricFamily& other) const;

 protected:
  // The series for `label_values`, created on first use; stable until Remove.
  // Throws std::invalid_argument when the number of values differs from label_names().
  MetricSeries& Series(const std::vector<std::string>& label_values);
  // A new, zeroed series of the family's type.
  virtual std::unique_ptr<MetricSeries> NewSeries() const = 0;

 private:
  void CheckArity(const std::vector<std::string>& label_values) const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;  // guards series_
  std::map<std::vector<std::string>, std::unique_ptr<MetricSeries>> series_;
};

class CounterFamily final : public MetricFamily {
 public:
  // A family without labels starts with its one series at 0, so it is exported from the start.
  CounterFamily(std::string name, std::string help, std::vector<std::string> label_names);
  // The counter for these label values, e.g. WithLabels({"cuda:0"}); see MetricFamily::Series.
  Counter& WithLabels(const std::vector<std::string>& label_values) {
    return static_cast<Counter&>(Series(label_values));
  }

 protected:
  std::unique_ptr<MetricSeries> NewSeries() const override;
};

class GaugeFamily final : public MetricFamily {
 public:
  // A family without labels starts with its one series at 0, so it is exported from the start.
  GaugeFamily(std::string name, std::string help, std::vector<std::string> label_names);
  // The gauge for these label values; see MetricFamily::Series.
  Gauge& WithLabels(const std::vector<std::string>& label_values) {
    return static_cast<Gauge&>(Series(label_values));
  }

 protected:
  std::unique_ptr<MetricSeries> NewSeries() const override;
};

class HistogramFamily final : public MetricFamily {
 public:
  // `upper_bounds` must be strictly increasing and not NaN; a trailing +Inf is dropped (the
  // +Inf bucket is always there). Label "le" is reserved. Throws std::invalid_argument.
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> upper_bounds);
  // The histogram for these label values; see MetricFamily::Series.
  Histogram& WithLabels(const std::vector<std::string>& label_values) {
    return static_cast<Histogram&>(Series(label_values));
  }
  // The finite bucket bounds.
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  bool SameDefinition(const MetricFamily& other) const override;

 protected:
  std::unique_ptr<MetricSeries> NewSeries() const override;

 private:
  std::vector<double> upper_bounds_;
};

// `count` bounds start, start*factor, start*factor^2, ... (start > 0, factor > 1, count >= 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ... (width > 0, count >= 1).
std::vector<double> LinearBuckets(double start, double width, int count);

}  // namespace qpool
