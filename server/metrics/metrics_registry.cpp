#include "metrics/metrics_registry.h"

#include <algorithm>
#include <exception>
#include <set>
#include <stdexcept>

#include "metrics/metric_names.h"
#include "metrics/text_exposition.h"
#include "util/log.h"

namespace qpool {

// Note [Collector merge]
// Values that live elsewhere (allocator statistics, per-pipeline bytes) are read at scrape time
// by collectors instead of being copied into gauges on every change. A collector emits loose
// samples; Collect groups them by name into families, so two collectors (say, one per device)
// can write the same family and it still has one HELP and one TYPE line. Collectors run on the
// scrape thread, where nothing may throw (no exception crosses a thread), so a bad sample is
// dropped with a warning instead: a malformed name or label, a name owned by a registered
// family, a help text or type that differs from the family's first sample, or a label set
// repeated within the family (Prometheus rejects the whole scrape on a duplicate series). A
// collector that throws loses all its samples of that scrape. Collected series are sorted by
// labels, so the output does not depend on collector order.
//
// The registered families are listed before the collectors run and read after them: series a
// collector creates in a registered family (a loaded pipeline's request series at 0, Note
// [Counters start at zero] in pool/pool_metrics.cpp) show in the same scrape, while a family a
// collector registers is read from the next scrape on.
namespace {

std::vector<std::string> SampleNames(const MetricFamily& family) {
  if (family.type() != MetricType::kHistogram) return {family.name()};
  return {family.name() + "_bucket", family.name() + "_sum", family.name() + "_count"};
}

// "" when the sample's name and labels are valid, else the reason.
std::string SampleProblem(const SampleSink::Entry& entry) {
  Status status = ValidateMetricName(entry.name);
  if (!status.ok()) return status.message();
  if (entry.help.empty()) return "help text is empty";
  std::set<std::string> seen;
  for (const auto& [label, value] : entry.labels) {
    status = ValidateLabelName(label);
    if (!status.ok()) return status.message();
    if (!seen.insert(label).second) return "label name '" + label + "' is repeated";
  }
  return "";
}

void DropSample(const SampleSink::Entry& entry, const std::string& why) {
  log::Warn("metrics: dropped collected sample ", entry.name, ": ", why);
}

// Adds the collected samples to `out`, creating families as needed (Note [Collector merge]).
void MergeCollected(const std::vector<SampleSink::Entry>& entries,
                    const std::map<std::string, std::unique_ptr<MetricFamily>>& registered,
                    const std::map<std::string, std::string>& registered_samples,
                    std::map<std::string, FamilySnapshot>* out) {
  for (const SampleSink::Entry& entry : entries) {
    std::string problem = SampleProblem(entry);
    if (problem.empty() && (registered.count(entry.name) || registered_samples.count(entry.name))) {
      problem = "the name belongs to a registered family";
    }
    if (!problem.empty()) {
      DropSample(entry, problem);
      continue;
    }
    auto [it, inserted] = out->try_emplace(entry.name);
    FamilySnapshot& family = it->second;
    if (inserted) {
      family.name = entry.name;
      family.help = entry.help;
      family.type = entry.type;
    } else if (family.type != entry.type || family.help != entry.help) {
      DropSample(entry, "help or type differs from the family's first sample");
      continue;
    }
    family.samples.push_back({"", entry.labels, entry.value});
  }
  for (auto& entry : *out) {
    if (registered.count(entry.first)) continue;
    const std::string& name = entry.first;
    std::vector<MetricSample>& samples = entry.second.samples;
    std::stable_sort(
        samples.begin(), samples.end(),
        [](const MetricSample& a, const MetricSample& b) { return a.labels < b.labels; });
    auto same_series = [&name](const MetricSample& a, const MetricSample& b) {
      if (a.labels != b.labels) return false;
      log::Warn("metrics: dropped collected sample ", name, ": its label set is repeated");
      return true;
    };
    samples.erase(std::unique(samples.begin(), samples.end(), same_series), samples.end());
  }
}

}  // namespace

void SampleSink::AddGauge(std::string name, std::string help, MetricLabels labels, double value) {
  entries_.push_back(
      {std::move(name), std::move(help), MetricType::kGauge, std::move(labels), value});
}

void SampleSink::AddCounter(std::string name, std::string help, MetricLabels labels, double value) {
  entries_.push_back(
      {std::move(name), std::move(help), MetricType::kCounter, std::move(labels), value});
}

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricFamily& MetricsRegistry::Register(std::unique_ptr<MetricFamily> family) {
  std::lock_guard<std::mutex> lock(mu_);
  auto existing = families_.find(family->name());
  if (existing != families_.end()) {
    if (existing->second->SameDefinition(*family)) return *existing->second;
    throw std::logic_error("metric " + family->name() +
                           " is already registered with a different type, help, labels or "
                           "buckets");
  }
  const std::vector<std::string> names = SampleNames(*family);
  for (const std::string& sample : names) {
    auto owner = sample_names_.find(sample);
    if (owner != sample_names_.end() || families_.count(sample)) {
      throw std::logic_error("metric " + family->name() + " would write samples named " + sample +
                             ", which belong to metric " +
                             (owner != sample_names_.end() ? owner->second : sample));
    }
  }
  if (sample_names_.count(family->name())) {
    throw std::logic_error("metric name " + family->name() + " is a sample name of metric " +
                           sample_names_[family->name()]);
  }
  for (const std::string& sample : names) sample_names_[sample] = family->name();
  MetricFamily& ref = *family;
  families_.emplace(family->name(), std::move(family));
  return ref;
}

CounterFamily& MetricsRegistry::AddCounter(const std::string& name, const std::string& help,
                                           const std::vector<std::string>& label_names) {
  return static_cast<CounterFamily&>(
      Register(std::make_unique<CounterFamily>(name, help, label_names)));
}

GaugeFamily& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                       const std::vector<std::string>& label_names) {
  return static_cast<GaugeFamily&>(
      Register(std::make_unique<GaugeFamily>(name, help, label_names)));
}

HistogramFamily& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                               const std::vector<std::string>& label_names,
                                               const std::vector<double>& bucket_upper_bounds) {
  return static_cast<HistogramFamily&>(
      Register(std::make_unique<HistogramFamily>(name, help, label_names, bucket_upper_bounds)));
}

MetricsRegistry::CollectorId MetricsRegistry::AddCollector(Collector collector) {
  std::lock_guard<std::mutex> lock(mu_);
  const CollectorId id = next_id_++;
  collectors_.emplace(id, std::move(collector));
  return id;
}

bool MetricsRegistry::RemoveCollector(CollectorId id) {
  std::lock_guard<std::mutex> scrape(scrape_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  return collectors_.erase(id) > 0;
}

std::vector<FamilySnapshot> MetricsRegistry::Collect() const {
  std::lock_guard<std::mutex> scrape(scrape_mu_);
  std::vector<const MetricFamily*> families;
  // Stable while we hold scrape_mu_: only RemoveCollector erases, and it takes scrape_mu_.
  std::vector<const Collector*> collectors;
  std::map<std::string, FamilySnapshot> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, family] : families_) families.push_back(family.get());
    for (const auto& [id, collector] : collectors_) collectors.push_back(&collector);
  }

  std::vector<SampleSink::Entry> collected;
  for (const Collector* collector : collectors) {
    SampleSink sink;
    try {
      (*collector)(sink);
    } catch (const std::exception& e) {
      log::Warn("metrics: a collector failed, its samples are left out of this scrape: ", e.what());
      continue;
    } catch (...) {
      log::Warn("metrics: a collector failed, its samples are left out of this scrape");
      continue;
    }
    collected.insert(collected.end(), sink.entries().begin(), sink.entries().end());
  }
  // Read after the collectors ran, so series they created in these families show now (Note
  // [Collector merge]).
  for (const MetricFamily* family : families) out.emplace(family->name(), family->Snapshot());
  {
    // A collector may have registered families since; they own their names from now on.
    std::lock_guard<std::mutex> lock(mu_);
    MergeCollected(collected, families_, sample_names_, &out);
  }

  std::vector<FamilySnapshot> result;
  result.reserve(out.size());
  for (auto& [name, family] : out) {
    if (!family.samples.empty()) result.push_back(std::move(family));
  }
  return result;
}

std::string MetricsRegistry::Expose() const { return ExposeText(Collect()); }

}  // namespace qpool
