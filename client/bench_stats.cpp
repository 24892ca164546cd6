#include "bench_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qpool::cli {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

Distribution Describe(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  d.min = values.front();
  d.max = values.back();
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = Percentile(values, 0.50);
  d.p90 = Percentile(values, 0.90);
  d.p99 = Percentile(values, 0.99);
  return d;
}

Summary Summarize(const std::vector<RequestRecord>& records) {
  Summary s;
  std::vector<double> latency, first_progress, queue, lag;
  std::map<std::string, std::vector<double>> template_latency;
  double first_scheduled = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  for (const RequestRecord& r : records) {
    if (r.warmup) {
      ++s.warmup_requests;
      ++s.warmup_codes[r.code];
      continue;
    }
    ++s.requests;
    ++s.codes[r.code];
    if (r.peer.empty()) {
      ++s.unanswered;
    } else {
      ++s.peers[r.peer];
    }
    first_scheduled = std::min(first_scheduled, r.scheduled_s);
    last_end = std::max(last_end, r.end_s);
    lag.push_back(r.start_s - r.scheduled_s);
    TemplateSummary& t = s.templates[r.template_name];
    ++t.requests;
    if (!r.ok()) {
      if (s.error_examples.count(r.code) == 0) s.error_examples[r.code] = r.error;
      continue;
    }
    ++s.ok;
    ++t.ok;
    s.images += r.images;
    ++s.devices[r.device];
    if (!r.route.empty()) ++s.routes[r.route];
    if (r.batch_size > 0) ++s.batch_sizes[r.batch_size];
    latency.push_back(r.latency_s());
    template_latency[r.template_name].push_back(r.latency_s());
    if (r.first_progress_s >= 0) first_progress.push_back(r.first_progress_latency_s());
    queue.push_back(r.queue_s);
  }
  if (s.requests > 0) s.window_s = std::max(0.0, last_end - first_scheduled);
  if (s.window_s > 0) {
    s.throughput_rps = static_cast<double>(s.ok) / s.window_s;
    s.images_per_s = static_cast<double>(s.images) / s.window_s;
  }
  s.latency = Describe(std::move(latency));
  s.first_progress = Describe(std::move(first_progress));
  s.queue = Describe(std::move(queue));
  s.send_lag = Describe(std::move(lag));
  for (auto& [name, values] : template_latency) {
    s.templates[name].latency = Describe(std::move(values));
  }
  return s;
}

double NiceBinWidth(double span_s, int target_bins) {
  const double raw = span_s / std::max(1, target_bins);
  if (!(raw > 0.001)) return 0.001;  // also catches NaN
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double step : {1.0, 2.0, 5.0}) {
    if (step * magnitude >= raw) return step * magnitude;
  }
  return 10 * magnitude;
}

std::vector<RateBin> ThroughputOverTime(const std::vector<RequestRecord>& records, double bin_s) {
  std::vector<RateBin> bins;
  if (records.empty() || !(bin_s > 0)) return bins;
  double last_end = 0;
  for (const RequestRecord& r : records) last_end = std::max(last_end, r.end_s);
  const size_t count = static_cast<size_t>(std::floor(last_end / bin_s)) + 1;
  bins.resize(count);
  for (size_t i = 0; i < count; ++i) bins[i].start_s = static_cast<double>(i) * bin_s;
  for (const RequestRecord& r : records) {
    const size_t i =
        std::min(count - 1, static_cast<size_t>(std::floor(std::max(0.0, r.end_s) / bin_s)));
    (r.ok() ? bins[i].ok_per_s : bins[i].errors_per_s) += 1 / bin_s;
  }
  return bins;
}

}  // namespace qpool::cli
