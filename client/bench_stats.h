// Statistics of a `qpool bench` run: percentiles, counts by status code, device and pod, and
// throughput over time. Pure functions of the records (bench_record.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench_record.h"

namespace qpool::cli {

// Order statistics of a set of values; count == 0 means "no values" (the rest are then 0).
struct Distribution {
  size_t count = 0;
  double min = 0;
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

// The q-quantile (0 <= q <= 1) of `sorted` (ascending, non-empty), interpolating linearly
// between the two closest ranks (numpy's default): {1, 2, 3, 4} has p50 2.5.
double Percentile(const std::vector<double>& sorted, double q);

// min, mean, p50, p90, p99 and max of `values` (any order).
Distribution Describe(std::vector<double> values);

// One mix entry's share of the measured requests.
struct TemplateSummary {
  size_t requests = 0;
  size_t ok = 0;
  Distribution latency;  // of its OK requests
};

// What a run measured. Only measured requests count (warm-up ones are in warmup_codes).
struct Summary {
  size_t requests = 0;  // measured requests, each counted once whatever its status
  size_t ok = 0;
  size_t images = 0;  // images of the OK requests
  size_t warmup_requests = 0;
  // From the first measured request's scheduled time to the last measured one's end.
  double window_s = 0;
  double throughput_rps = 0;  // OK requests per second of the window
  double images_per_s = 0;
  Distribution latency;                 // OK requests, from the scheduled time (RequestRecord)
  Distribution first_progress;          // OK requests that streamed a Progress message
  Distribution queue;                   // OK requests: the server's queue time
  Distribution send_lag;                // every measured request: started minus scheduled
  std::map<std::string, size_t> codes;  // status code name -> requests
  std::map<std::string, size_t> warmup_codes;         // the same for the warm-up
  std::map<std::string, std::string> error_examples;  // failed code -> its first message
  std::map<std::string, size_t> devices;              // OK requests by the device that ran them
  std::map<std::string, size_t> peers;                // requests by the pod that answered them
  size_t unanswered = 0;  // requests that failed before any server answered (no peer)
  std::map<std::string, size_t> routes;    // OK requests by GenerateResult.route
  std::map<uint32_t, size_t> batch_sizes;  // OK requests by the batch they ran in
  std::map<std::string, TemplateSummary> templates;
};

Summary Summarize(const std::vector<RequestRecord>& records);

// Requests finishing per second in [start_s, start_s + width), by outcome.
struct RateBin {
  double start_s = 0;
  double ok_per_s = 0;
  double errors_per_s = 0;
};

// A bin width of 1, 2 or 5 times a power of ten giving about `target_bins` bins over
// `span_s` seconds (at least 1 ms).
double NiceBinWidth(double span_s, int target_bins);

// Completions of every request (warm-up included) per `bin_s`-second bin, from 0 to the last
// end; empty without records. bin_s > 0.
std::vector<RateBin> ThroughputOverTime(const std::vector<RequestRecord>& records, double bin_s);

}  // namespace qpool::cli
