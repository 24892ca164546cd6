// `qpool bench` statistics: percentiles, what counts as a measured request, and throughput bins.
#include "bench_stats.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qpool::cli {
namespace {

RequestRecord Ok(uint64_t index, double scheduled, double end, const std::string& device = "cpu") {
  RequestRecord r;
  r.index = index;
  r.template_name = "tiny";
  r.pipeline = "tiny";
  r.scheduled_s = scheduled;
  r.start_s = scheduled;
  r.end_s = end;
  r.code = "OK";
  r.device = device;
  r.peer = "ipv4:10.0.0.1:50051";
  r.images = 1;
  r.batch_size = 1;
  return r;
}

RequestRecord Failed(uint64_t index, double scheduled, double end, const std::string& code) {
  RequestRecord r = Ok(index, scheduled, end);
  r.code = code;
  r.error = "it failed";
  r.device.clear();
  r.images = 0;
  return r;
}

TEST(BenchStats, PercentileInterpolatesBetweenRanks) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 1), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 0.5), 0);
  // 0..100: the q-quantile is 100 q.
  std::vector<double> hundred;
  for (int i = 0; i <= 100; ++i) hundred.push_back(i);
  EXPECT_NEAR(Percentile(hundred, 0.9), 90, 1e-9);
  EXPECT_NEAR(Percentile(hundred, 0.99), 99, 1e-9);
}

TEST(BenchStats, DescribeSortsAndOrdersItsPercentiles) {
  const Distribution d = Describe({5, 1, 4, 2, 3, 100});
  EXPECT_EQ(d.count, 6u);
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 100);
  EXPECT_NEAR(d.mean, 115.0 / 6, 1e-12);
  EXPECT_LE(d.min, d.p50);
  EXPECT_LE(d.p50, d.p90);
  EXPECT_LE(d.p90, d.p99);
  EXPECT_LE(d.p99, d.max);
  EXPECT_EQ(Describe({}).count, 0u);
}

TEST(BenchStats, EveryMeasuredRequestCountsOnceAndWarmupApart) {
  std::vector<RequestRecord> records;
  RequestRecord warm = Ok(0, 0, 0.5);
  warm.warmup = true;
  records.push_back(warm);
  records.push_back(Ok(1, 1.0, 1.2, "cuda:0"));
  records.push_back(Ok(2, 1.1, 1.4, "cuda:1"));
  records.push_back(Ok(3, 1.2, 1.6, "cuda:0"));
  records.push_back(Failed(4, 1.3, 1.3, "NOT_FOUND"));
  RequestRecord unsent = Failed(5, 1.4, 1.5, "DEADLINE_EXCEEDED");
  unsent.peer.clear();  // never reached a server
  records.push_back(unsent);

  const Summary s = Summarize(records);
  EXPECT_EQ(s.requests, 5u);
  EXPECT_EQ(s.ok, 3u);
  EXPECT_EQ(s.warmup_requests, 1u);
  EXPECT_EQ(s.warmup_codes, (std::map<std::string, size_t>{{"OK", 1}}));
  EXPECT_EQ(s.codes,
            (std::map<std::string, size_t>{{"OK", 3}, {"NOT_FOUND", 1}, {"DEADLINE_EXCEEDED", 1}}));
  EXPECT_EQ(s.devices, (std::map<std::string, size_t>{{"cuda:0", 2}, {"cuda:1", 1}}));
  EXPECT_EQ(s.peers, (std::map<std::string, size_t>{{"ipv4:10.0.0.1:50051", 4}}));
  EXPECT_EQ(s.unanswered, 1u);
  EXPECT_EQ(s.error_examples.at("NOT_FOUND"), "it failed");
  // The window runs from the first measured request's due time to the last end.
  EXPECT_DOUBLE_EQ(s.window_s, 0.6);
  EXPECT_DOUBLE_EQ(s.throughput_rps, 3 / 0.6);
  EXPECT_EQ(s.latency.count, 3u);
  EXPECT_DOUBLE_EQ(s.latency.max, 0.4);
  EXPECT_EQ(s.templates.at("tiny").requests, 5u);
  EXPECT_EQ(s.templates.at("tiny").ok, 3u);
}

TEST(BenchStats, LatencyRunsFromTheScheduledTime) {
  RequestRecord late = Ok(0, 1.0, 3.0);
  late.start_s = 2.5;  // the sender fell 1.5 s behind
  late.first_progress_s = 2.7;
  const Summary s = Summarize({late});
  EXPECT_DOUBLE_EQ(s.latency.p50, 2.0);
  EXPECT_DOUBLE_EQ(s.first_progress.p50, 1.7);
  EXPECT_DOUBLE_EQ(s.send_lag.max, 1.5);
}

TEST(BenchStats, NothingMeasuredGivesZerosNotNaN) {
  const Summary s = Summarize({Failed(0, 0, 0.1, "UNAVAILABLE")});
  EXPECT_EQ(s.ok, 0u);
  EXPECT_EQ(s.latency.count, 0u);
  EXPECT_EQ(s.throughput_rps, 0);
  const Summary empty = Summarize({});
  EXPECT_EQ(empty.requests, 0u);
  EXPECT_EQ(empty.window_s, 0);
}

TEST(BenchStats, NiceBinWidths) {
  EXPECT_DOUBLE_EQ(NiceBinWidth(10, 40), 0.5);
  EXPECT_DOUBLE_EQ(NiceBinWidth(60, 40), 2);
  EXPECT_DOUBLE_EQ(NiceBinWidth(0.82, 40), 0.05);
  EXPECT_DOUBLE_EQ(NiceBinWidth(0, 40), 0.001);
}

TEST(BenchStats, ThroughputBinsCountCompletionsByOutcome) {
  const std::vector<RequestRecord> records = {Ok(0, 0, 0.1), Ok(1, 0, 0.4),
                                              Failed(2, 0, 0.45, "NOT_FOUND"), Ok(3, 0, 1.0)};
  const std::vector<RateBin> bins = ThroughputOverTime(records, 0.5);
  ASSERT_EQ(bins.size(), 3u);  // [0, 0.5), [0.5, 1), [1, 1.5)
  EXPECT_DOUBLE_EQ(bins[0].ok_per_s, 4);
  EXPECT_DOUBLE_EQ(bins[0].errors_per_s, 2);
  EXPECT_DOUBLE_EQ(bins[1].ok_per_s, 0);
  EXPECT_DOUBLE_EQ(bins[2].ok_per_s, 2);
  EXPECT_DOUBLE_EQ(bins[2].start_s, 1.0);
  EXPECT_TRUE(ThroughputOverTime({}, 1).empty());
}

}  // namespace
}  // namespace qpool::cli
