// RequestMetrics: the request families as a scrape shows them: counts and durations by pipeline,
// RPC and status, the "unknown" pipeline label, queue and memory histograms and their buckets.
#include "pool/request_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "metrics/text_exposition.h"
#include "testing/metric_samples.h"

namespace qpool {
namespace {

using ::qpool::testing::SampleValue;

// `labels` plus the `le` label of the bucket bounded by `bound`.
MetricLabels Bucket(MetricLabels labels, double bound) {
  labels.emplace_back("le", FormatMetricValue(bound));
  return labels;
}

TEST(RequestMetricsTest, CountsEachRequestUnderItsPipelineRpcAndStatus) {
  MetricsRegistry registry;
  RequestMetrics metrics(registry);
  metrics.RecordFinished("tiny", RequestRpc::kGenerate, StatusCode::kOk, 0.2);
  metrics.RecordFinished("tiny", RequestRpc::kGenerate, StatusCode::kOk, 3);
  metrics.RecordFinished("tiny", RequestRpc::kEncode, StatusCode::kOk, 0.004);
  metrics.RecordFinished("tiny", RequestRpc::kGenerate, StatusCode::kInvalidArgument, 0.001);
  metrics.RecordFinished(RequestMetrics::kUnknownPipeline, RequestRpc::kGenerate,
                         StatusCode::kNotFound, 0.001);

  const MetricLabels generate_ok = {{"pipeline", "tiny"}, {"rpc", "generate"}, {"status", "OK"}};
  const MetricLabels encode_ok = {{"pipeline", "tiny"}, {"rpc", "encode"}, {"status", "OK"}};
  const MetricLabels invalid = {
      {"pipeline", "tiny"}, {"rpc", "generate"}, {"status", "INVALID_ARGUMENT"}};
  const MetricLabels not_found = {
      {"pipeline", "unknown"}, {"rpc", "generate"}, {"status", "NOT_FOUND"}};
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total", generate_ok), 2);
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total", encode_ok), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total", invalid), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total", not_found), 1);

  // Durations: one observation per request, in the series of the same labels.
  EXPECT_EQ(SampleValue(registry, "qpool_request_duration_seconds_count", generate_ok), 2);
  EXPECT_DOUBLE_EQ(SampleValue(registry, "qpool_request_duration_seconds_sum", generate_ok), 3.2);
  EXPECT_EQ(
      SampleValue(registry, "qpool_request_duration_seconds_bucket", Bucket(generate_ok, 0.25)), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_request_duration_seconds_bucket", Bucket(generate_ok, 5)),
            2);
  EXPECT_EQ(
      SampleValue(registry, "qpool_request_duration_seconds_bucket", Bucket(encode_ok, 0.005)), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_request_duration_seconds_count", not_found), 1);
}

TEST(RequestMetricsTest, NamesTheRepositoryPipelineOrUnknown) {
  // Acquire's answers for names the repository holds keep the name ...
  EXPECT_EQ(RequestMetrics::PipelineLabel("tiny", Status::Ok()), "tiny");
  EXPECT_EQ(RequestMetrics::PipelineLabel("tiny", FailedPrecondition("not loaded")), "tiny");
  EXPECT_EQ(RequestMetrics::PipelineLabel("tiny", Unavailable("being moved")), "tiny");
  // ... and names chosen by the client that the repository does not hold never become labels.
  EXPECT_EQ(RequestMetrics::PipelineLabel("no-such", NotFound("no pipeline")), "unknown");
  EXPECT_EQ(RequestMetrics::PipelineLabel("../etc", InvalidArgument("bad name")), "unknown");
  EXPECT_EQ(RequestMetrics::PipelineLabel("", InvalidArgument("empty")), "unknown");
}

TEST(RequestMetricsTest, StatusAndRpcLabelValues) {
  // The status label is the gRPC name of the code the call ends with.
  EXPECT_STREQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_STREQ(StatusCodeName(StatusCode::kCancelled), "CANCELLED");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_STREQ(StatusCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(StatusCodeName(StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  // A value outside the enum still maps to one fixed label.
  EXPECT_STREQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN");
  EXPECT_STREQ(RequestRpcName(RequestRpc::kGenerate), "generate");
  EXPECT_STREQ(RequestRpcName(RequestRpc::kEncode), "encode");
}

TEST(RequestMetricsTest, QueueAndMemoryHistograms) {
  MetricsRegistry registry;
  RequestMetrics metrics(registry);
  metrics.RecordQueued("tiny", RequestRpc::kGenerate, 0.0001);
  metrics.RecordQueued("tiny", RequestRpc::kGenerate, 0.75);
  metrics.RecordMemory("tiny", RequestRpc::kGenerate, "cuda:0", 3ull << 30, 3ull << 20);

  const MetricLabels queue = {{"pipeline", "tiny"}, {"rpc", "generate"}};
  EXPECT_EQ(SampleValue(registry, "qpool_request_queue_seconds_count", queue), 2);
  EXPECT_EQ(SampleValue(registry, "qpool_request_queue_seconds_bucket", Bucket(queue, 0.0005)), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_request_queue_seconds_bucket", Bucket(queue, 0.5)), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_request_queue_seconds_bucket", Bucket(queue, 1)), 2);

  constexpr double kMiB = 1 << 20;
  constexpr double kGiB = 1 << 30;
  const MetricLabels memory = {{"pipeline", "tiny"}, {"rpc", "generate"}, {"device", "cuda:0"}};
  EXPECT_EQ(SampleValue(registry, "qpool_request_peak_memory_bytes_sum", memory), 3 * kGiB);
  EXPECT_EQ(SampleValue(registry, "qpool_request_working_memory_bytes_sum", memory), 3 * kMiB);
  // Buckets are powers of two from 1 MiB to 256 GiB: 3 GiB lands in le=4 GiB, 3 MiB in 4 MiB.
  const std::string peak = "qpool_request_peak_memory_bytes_bucket";
  const std::string working = "qpool_request_working_memory_bytes_bucket";
  EXPECT_EQ(SampleValue(registry, peak, Bucket(memory, 2 * kGiB)), 0);
  EXPECT_EQ(SampleValue(registry, peak, Bucket(memory, 4 * kGiB)), 1);
  EXPECT_EQ(SampleValue(registry, peak, Bucket(memory, 256 * kGiB)), 1);   // the last finite one
  EXPECT_EQ(SampleValue(registry, working, Bucket(memory, 1 * kMiB)), 0);  // the first
  EXPECT_EQ(SampleValue(registry, working, Bucket(memory, 4 * kMiB)), 1);
}

TEST(RequestMetricsTest, ExposesTypedFamiliesOnlyOnceUsed) {
  MetricsRegistry registry;
  RequestMetrics metrics(registry);
  // No series yet: nothing to export (Prometheus treats an absent series as no requests).
  EXPECT_EQ(registry.Expose(), "");
  metrics.RecordFinished("tiny", RequestRpc::kEncode, StatusCode::kOk, 0.01);
  const std::string text = registry.Expose();
  EXPECT_NE(text.find("# TYPE qpool_requests_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE qpool_request_duration_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("qpool_requests_total{pipeline=\"tiny\",rpc=\"encode\",status=\"OK\"} 1\n"),
            std::string::npos)
      << text;
  // The second registration of the same families (a second RequestMetrics) shares them.
  RequestMetrics again(registry);
  again.RecordFinished("tiny", RequestRpc::kEncode, StatusCode::kOk, 0.01);
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total",
                        {{"pipeline", "tiny"}, {"rpc", "encode"}, {"status", "OK"}}),
            2);
}

TEST(RequestMetricsTest, CreateSeriesStartsALoadedPipelinesSeriesAtZero) {
  MetricsRegistry registry;
  RequestMetrics metrics(registry);
  metrics.RecordFinished("tiny", RequestRpc::kGenerate, StatusCode::kOk, 0.5);
  metrics.CreateSeries("tiny", {"cpu", "cuda:0"});

  const MetricLabels generate_ok = {{"pipeline", "tiny"}, {"rpc", "generate"}, {"status", "OK"}};
  const MetricLabels encode_ok = {{"pipeline", "tiny"}, {"rpc", "encode"}, {"status", "OK"}};
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total", generate_ok), 1);  // kept
  EXPECT_EQ(SampleValue(registry, "qpool_requests_total", encode_ok), 0);
  EXPECT_EQ(SampleValue(registry, "qpool_request_duration_seconds_count", encode_ok), 0);
  EXPECT_EQ(SampleValue(registry, "qpool_request_queue_seconds_count",
                        {{"pipeline", "tiny"}, {"rpc", "encode"}}),
            0);
  EXPECT_EQ(
      SampleValue(registry, "qpool_batch_size_count", {{"pipeline", "tiny"}, {"device", "cpu"}}),
      0);
  // Request memory is measured on GPUs only: no CPU series.
  const MetricLabels cpu = {{"pipeline", "tiny"}, {"rpc", "generate"}, {"device", "cpu"}};
  const MetricLabels gpu = {{"pipeline", "tiny"}, {"rpc", "generate"}, {"device", "cuda:0"}};
  EXPECT_TRUE(std::isnan(SampleValue(registry, "qpool_request_peak_memory_bytes_count", cpu)));
  EXPECT_EQ(SampleValue(registry, "qpool_request_peak_memory_bytes_count", gpu), 0);
}

}  // namespace
}  // namespace qpool
