// MetricsRegistry: the server's metric families plus scrape-time collectors, exposed as
// Prometheus text. One per server, passed by reference to whoever records metrics (no global).
//
// Thread safety and lock rules:
//  - Counter/Gauge/Histogram updates never touch the registry (metric_family.h).
//  - All public methods are thread-safe. Add* and AddCollector take the registry mutex;
//    Collect, Expose and RemoveCollector also take the scrape mutex, which serializes scrapes.
//    Lock order: scrape mutex, registry mutex, a family's mutex.
//  - Collectors run with only the scrape mutex held, one scrape at a time. A collector may
//    register families but must not call Collect, Expose or RemoveCollector (self-deadlock),
//    and must not block for long: the /metrics request waits for it.
//
// Registration errors are programming errors and throw (at startup, on the thread that
// registers): std::invalid_argument for a malformed name, label or bucket list, and
// std::logic_error for a name registered again with a different definition.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/metric_family.h"
#include "metrics/metric_snapshot.h"

namespace qpool {

// What a collector emits at scrape time: counter and gauge samples with their family's name,
// help and labels. Samples of one name (from any collector) are merged into one family.
class SampleSink {
 public:
  struct Entry {
    std::string name;
    std::string help;
    MetricType type = MetricType::kGauge;
    MetricLabels labels;
    double value = 0;
  };

  // Adds a gauge sample, e.g. AddGauge("qpool_device_memory_free_bytes", "...",
  // {{"device", "cuda:0"}}, 1.5e9).
  void AddGauge(std::string name, std::string help, MetricLabels labels, double value);
  // Adds a counter sample (name should end in "_total").
  void AddCounter(std::string name, std::string help, MetricLabels labels, double value);
  // Everything added so far, in order.
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

class MetricsRegistry {
 public:
  using Collector = std::function<void(SampleSink&)>;
  using CollectorId = uint64_t;

  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The counter family `name` (should end in "_total"); an identical earlier registration
  // (name, help, labels) returns the existing family. The reference lives as long as the
  // registry. Throws as described at the top of this file.
  CounterFamily& AddCounter(const std::string& name, const std::string& help,
                            const std::vector<std::string>& label_names = {});
  // The gauge family `name`; same rules as AddCounter.
  GaugeFamily& AddGauge(const std::string& name, const std::string& help,
                        const std::vector<std::string>& label_names = {});
  // The histogram family `name` with these finite bucket bounds (+Inf is implicit); same rules
  // as AddCounter, and an identical registration also has the same bounds.
  HistogramFamily& AddHistogram(const std::string& name, const std::string& help,
                                const std::vector<std::string>& label_names,
                                const std::vector<double>& bucket_upper_bounds);

  // Runs `collector` at every scrape, before the families are read (Note [Collector merge]).
  // Returns its id.
  CollectorId AddCollector(Collector collector);
  // Stops calling the collector; once this returns it is not running and will not run again,
  // so what it captured may be destroyed. False for an unknown id.
  bool RemoveCollector(CollectorId id);

  // Every non-empty family, registered and collected, sorted by name (Note [Collector merge]).
  std::vector<FamilySnapshot> Collect() const;
  // Collect() in Prometheus text format 0.0.4 (text_exposition.h).
  std::string Expose() const;

 private:
  // Inserts `family` or returns the identical existing one; throws std::logic_error on a
  // conflict. Takes mu_.
  MetricFamily& Register(std::unique_ptr<MetricFamily> family);

  mutable std::mutex scrape_mu_;  // serializes Collect; held by RemoveCollector
  mutable std::mutex mu_;         // guards families_, sample_names_, collectors_, next_id_
  std::map<std::string, std::unique_ptr<MetricFamily>> families_;
  // Sample name ("x_bucket", ...) -> the registered family that writes it.
  std::map<std::string, std::string> sample_names_;
  std::map<CollectorId, Collector> collectors_;
  CollectorId next_id_ = 1;
};

}  // namespace qpool
