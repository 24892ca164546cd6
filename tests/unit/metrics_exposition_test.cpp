// Prometheus text format 0.0.4: exact output for counters, gauges and histograms with labels
// and escaping, value formatting, and `promtool check metrics` on a registry populated like
// the server's.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "metrics/metrics_registry.h"
#include "metrics/text_exposition.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

TEST(MetricsExpositionTest, FormatsValues) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(1), "1");
  EXPECT_EQ(FormatMetricValue(-42), "-42");
  EXPECT_EQ(FormatMetricValue(8589934592.0), "8589934592");                // 8 GiB
  EXPECT_EQ(FormatMetricValue(9007199254740992.0), "9007199254740992");    // 2^53
  EXPECT_EQ(FormatMetricValue(-9007199254740992.0), "-9007199254740992");  // -2^53
  // Beyond 2^53: the shortest form that reads back exactly, fixed or exponent.
  EXPECT_EQ(FormatMetricValue(9007199254740994.0), "9007199254740994");
  EXPECT_EQ(FormatMetricValue(1e20), "1e+20");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(0.005), "0.005");
  EXPECT_EQ(FormatMetricValue(2.5), "2.5");
  EXPECT_EQ(FormatMetricValue(123456789.5), "123456789.5");
  EXPECT_EQ(FormatMetricValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatMetricValue(1e-7), "1e-07");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
}

TEST(MetricsExpositionTest, Escapes) {
  EXPECT_EQ(EscapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");  // quotes stay in HELP
  EXPECT_EQ(EscapeLabelValue("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  EXPECT_EQ(EscapeLabelValue("cuda:0"), "cuda:0");
}

TEST(MetricsExpositionTest, ExactTextForEachType) {
  MetricsRegistry registry;
  CounterFamily& requests =
      registry.AddCounter("qpool_requests_total", "Generate requests by pipeline and status code.",
                          {"pipeline", "code"});
  requests.WithLabels({"sd-turbo", "OK"}).Inc(3);
  requests.WithLabels({"sd-turbo", "INVALID_ARGUMENT"}).Inc();
  registry.AddGauge("qpool_pipeline_bytes", "Bytes held by a pipeline.", {"pipeline", "kind"})
      .WithLabels({"a\"b\\c\nd", "weight"})
      .Set(8589934592.0);
  Histogram& latency =
      registry
          .AddHistogram("qpool_generate_duration_seconds", "Latency with \\ and\nnewline.",
                        {"pipeline"}, {0.5, 1, 2.5})
          .WithLabels({"tiny"});
  latency.Observe(0.25);
  latency.Observe(1);
  latency.Observe(3);
  registry.AddCounter("qpool_restarts_total", "A counter without labels starts at 0.");
  registry.AddGauge("qpool_unused", "A labelled family without series is left out.", {"device"});

  EXPECT_EQ(registry.Expose(),
            "# HELP qpool_generate_duration_seconds Latency with \\\\ and\\nnewline.\n"
            "# TYPE qpool_generate_duration_seconds histogram\n"
            "qpool_generate_duration_seconds_bucket{pipeline=\"tiny\",le=\"0.5\"} 1\n"
            "qpool_generate_duration_seconds_bucket{pipeline=\"tiny\",le=\"1\"} 2\n"
            "qpool_generate_duration_seconds_bucket{pipeline=\"tiny\",le=\"2.5\"} 2\n"
            "qpool_generate_duration_seconds_bucket{pipeline=\"tiny\",le=\"+Inf\"} 3\n"
            "qpool_generate_duration_seconds_sum{pipeline=\"tiny\"} 4.25\n"
            "qpool_generate_duration_seconds_count{pipeline=\"tiny\"} 3\n"
            "# HELP qpool_pipeline_bytes Bytes held by a pipeline.\n"
            "# TYPE qpool_pipeline_bytes gauge\n"
            "qpool_pipeline_bytes{pipeline=\"a\\\"b\\\\c\\nd\",kind=\"weight\"} 8589934592\n"
            "# HELP qpool_requests_total Generate requests by pipeline and status code.\n"
            "# TYPE qpool_requests_total counter\n"
            "qpool_requests_total{pipeline=\"sd-turbo\",code=\"INVALID_ARGUMENT\"} 1\n"
            "qpool_requests_total{pipeline=\"sd-turbo\",code=\"OK\"} 3\n"
            "# HELP qpool_restarts_total A counter without labels starts at 0.\n"
            "# TYPE qpool_restarts_total counter\n"
            "qpool_restarts_total 0\n");
}

TEST(MetricsExpositionTest, CollectedFamiliesHaveOneHelpAndTypeAmongRegisteredOnes) {
  MetricsRegistry registry;
  registry.AddGauge("qpool_b", "Registered.").WithLabels({}).Set(0.5);
  for (const char* device : {"cuda:1", "cuda:0"}) {
    registry.AddCollector([device](SampleSink& sink) {
      sink.AddGauge("qpool_c_bytes", "Collected.", {{"device", device}}, 1024);
      sink.AddCounter("qpool_a_total", "Collected counter.", {{"device", device}}, 2);
    });
  }
  EXPECT_EQ(registry.Expose(),
            "# HELP qpool_a_total Collected counter.\n"
            "# TYPE qpool_a_total counter\n"
            "qpool_a_total{device=\"cuda:0\"} 2\n"
            "qpool_a_total{device=\"cuda:1\"} 2\n"
            "# HELP qpool_b Registered.\n"
            "# TYPE qpool_b gauge\n"
            "qpool_b 0.5\n"
            "# HELP qpool_c_bytes Collected.\n"
            "# TYPE qpool_c_bytes gauge\n"
            "qpool_c_bytes{device=\"cuda:0\"} 1024\n"
            "qpool_c_bytes{device=\"cuda:1\"} 1024\n");
}

// Runs `promtool check metrics` on `text`; returns its exit code and fills `output`.
int Promtool(const std::string& text, std::string* output) {
  const std::string dir = testing::MakeTempDir("metrics-promtool");
  const std::string path = dir + "/metrics.txt";
  testing::WriteFile(path, text);
  FILE* pipe = popen(("promtool check metrics < '" + path + "' 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool HavePromtool() { return std::system("command -v promtool > /dev/null 2>&1") == 0; }

// A registry with the kinds of metrics the server exports (docs/metrics.md).
void PopulateLikeTheServer(MetricsRegistry& registry) {
  registry.AddGauge("qpool_build_info", "qpool-server build; the value is always 1.", {"version"})
      .WithLabels({"0.1.0"})
      .Set(1);
  registry.AddCollector([](SampleSink& sink) {
    for (const char* device : {"cpu", "cuda:0", "cuda:1"}) {
      sink.AddGauge("qpool_device_memory_allocated_bytes",
                    "Bytes in use by tensors on the device (caching allocator).",
                    {{"device", device}}, 6442450944.0);
      sink.AddGauge("qpool_device_memory_reserved_bytes",
                    "Bytes the caching allocator holds from the driver.", {{"device", device}},
                    8589934592.0);
      sink.AddCounter("qpool_device_memory_ooms_total",
                      "Out-of-memory errors raised by the caching allocator.", {{"device", device}},
                      0);
    }
  });
  HistogramFamily& events = registry.AddHistogram(
      "qpool_memory_event_duration_seconds", "Duration of load, offload and move events.",
      {"device", "kind"}, ExponentialBuckets(0.001, 4, 8));
  events.WithLabels({"cuda:0", "load"}).Observe(0.8);
  events.WithLabels({"cuda:0", "offload"}).Observe(0.02);
  CounterFamily& requests =
      registry.AddCounter("qpool_requests_total", "Generate requests by pipeline and status code.",
                          {"pipeline", "code"});
  requests.WithLabels({"sd-turbo", "OK"}).Inc(12);
  requests.WithLabels({"sd-turbo", "RESOURCE_EXHAUSTED"}).Inc();
  registry
      .AddGauge("qpool_pipeline_bytes", "Bytes held by a loaded pipeline's components.",
                {"pipeline", "component", "kind"})
      .WithLabels({"sd-turbo", "unet", "weight"})
      .Set(1732000000);
  registry.AddCounter("qpool_generated_images_total", "Images returned to clients.")
      .WithLabels({})
      .Inc(40);
}

TEST(MetricsExpositionTest, PromtoolAcceptsAServerLikeExposition) {
  ASSERT_TRUE(HavePromtool())
      << "promtool is not installed (Debian package 'prometheus'); run scripts/setup.sh";
  MetricsRegistry registry;
  PopulateLikeTheServer(registry);
  const std::string text = registry.Expose();
  std::string output;
  EXPECT_EQ(Promtool(text, &output), 0) << output << "\n--- exposition:\n" << text;
  EXPECT_EQ(output, "") << "promtool lint complaints:\n" << output;
}

TEST(MetricsExpositionTest, PromtoolCheckCatchesLintProblems) {
  // The check above is only worth something if promtool does complain about what we avoid.
  ASSERT_TRUE(HavePromtool())
      << "promtool is not installed (Debian package 'prometheus'); run scripts/setup.sh";
  MetricsRegistry registry;
  registry.AddCounter("qpool_requests", "A counter without _total.").WithLabels({}).Inc();
  std::string output;
  EXPECT_NE(Promtool(registry.Expose(), &output), 0);
  EXPECT_NE(output.find("_total"), std::string::npos) << output;
}

}  // namespace
}  // namespace qpool
