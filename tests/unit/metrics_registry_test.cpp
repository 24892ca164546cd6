// MetricsRegistry: registration rules, series by labels, Remove, lock-free updates under
// contention, and scrape-time collectors merged into families.
#include "metrics/metrics_registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace qpool {
namespace {

// The family called `name` in a scrape, or nullptr.
const FamilySnapshot* Find(const std::vector<FamilySnapshot>& families, const std::string& name) {
  for (const FamilySnapshot& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

TEST(MetricsRegistryTest, IdenticalRegistrationReturnsTheSameFamily) {
  MetricsRegistry registry;
  CounterFamily& a = registry.AddCounter("qpool_requests_total", "Requests.", {"pipeline"});
  CounterFamily& b = registry.AddCounter("qpool_requests_total", "Requests.", {"pipeline"});
  EXPECT_EQ(&a, &b);
  HistogramFamily& h1 = registry.AddHistogram("qpool_latency_seconds", "Latency.", {}, {0.1, 1});
  HistogramFamily& h2 = registry.AddHistogram("qpool_latency_seconds", "Latency.", {}, {0.1, 1});
  EXPECT_EQ(&h1, &h2);
}

TEST(MetricsRegistryTest, ConflictingRegistrationThrowsLogicError) {
  MetricsRegistry registry;
  registry.AddCounter("qpool_requests_total", "Requests.", {"pipeline"});
  EXPECT_THROW(registry.AddGauge("qpool_requests_total", "Requests.", {"pipeline"}),
               std::logic_error);
  EXPECT_THROW(registry.AddCounter("qpool_requests_total", "Requests.", {"device"}),
               std::logic_error);
  EXPECT_THROW(registry.AddCounter("qpool_requests_total", "Other help.", {"pipeline"}),
               std::logic_error);
  registry.AddHistogram("qpool_latency_seconds", "Latency.", {}, {0.1, 1});
  EXPECT_THROW(registry.AddHistogram("qpool_latency_seconds", "Latency.", {}, {0.1, 2}),
               std::logic_error);
  // A histogram writes x_bucket, x_sum and x_count: those names are taken, and the reverse.
  EXPECT_THROW(registry.AddGauge("qpool_latency_seconds_count", "Count.", {}), std::logic_error);
  registry.AddGauge("qpool_queue_sum", "Sum.", {});
  EXPECT_THROW(registry.AddHistogram("qpool_queue", "Queue.", {}, {1}), std::logic_error);
}

TEST(MetricsRegistryTest, BadNamesAreRejected) {
  MetricsRegistry registry;
  for (const std::string name :
       {"", "1abc", "qpool-requests", "qpool:requests", "qpool requests", "qpool_bytes\n"}) {
    EXPECT_THROW(registry.AddGauge(name, "Help.", {}), std::invalid_argument) << name;
  }
  for (const std::string label : {"", "0device", "de-vice", "__name__", "__x"}) {
    EXPECT_THROW(registry.AddGauge("qpool_x", "Help.", {label}), std::invalid_argument) << label;
  }
  EXPECT_THROW(registry.AddGauge("qpool_x", "Help.", {"device", "device"}), std::invalid_argument);
  EXPECT_THROW(registry.AddGauge("qpool_x", "", {}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("qpool_h", "Help.", {"le"}, {1}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("qpool_h", "Help.", {}, {1, 1}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("qpool_h", "Help.", {}, {2, 1}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("qpool_h", "Help.", {}, {NAN}), std::invalid_argument);
  // Valid: leading underscore, digits, a trailing +Inf (dropped).
  EXPECT_NO_THROW(registry.AddGauge("_qpool_x9", "Help.", {"_device2"}));
  EXPECT_EQ(registry.AddHistogram("qpool_h", "Help.", {}, {1, INFINITY}).upper_bounds(),
            std::vector<double>{1});
}

TEST(MetricsRegistryTest, WithLabelsIsStableAndChecksArity) {
  MetricsRegistry registry;
  GaugeFamily& family = registry.AddGauge("qpool_bytes", "Bytes.", {"device", "kind"});
  Gauge& a = family.WithLabels({"cuda:0", "weight"});
  a.Set(5);
  family.WithLabels({"cuda:1", "weight"}).Inc(2);
  EXPECT_EQ(&a, &family.WithLabels({"cuda:0", "weight"}));
  EXPECT_EQ(family.WithLabels({"cuda:0", "weight"}).value(), 5);
  EXPECT_EQ(family.series_count(), 2u);
  EXPECT_THROW(family.WithLabels({"cuda:0"}), std::invalid_argument);
  EXPECT_THROW(family.WithLabels({"cuda:0", "weight", "x"}), std::invalid_argument);
  EXPECT_THROW(family.Remove({}), std::invalid_argument);
}

TEST(MetricsRegistryTest, CounterAndGaugeArithmetic) {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("qpool_events_total", "Events.").WithLabels({});
  counter.Inc();
  counter.Inc(2.5);
  counter.Inc(-1);   // ignored: counters never go down
  counter.Inc(NAN);  // ignored
  EXPECT_EQ(counter.value(), 3.5);
  Gauge& gauge = registry.AddGauge("qpool_in_flight", "In flight.").WithLabels({});
  gauge.Inc();
  gauge.Inc(3);
  gauge.Dec();
  gauge.Dec(0.5);
  EXPECT_EQ(gauge.value(), 2.5);
  gauge.Set(-7);
  EXPECT_EQ(gauge.value(), -7);
}

TEST(MetricsRegistryTest, HistogramBucketsByUpperBound) {
  MetricsRegistry registry;
  Histogram& h = registry.AddHistogram("qpool_s", "S.", {}, {1, 2, 4}).WithLabels({});
  for (double v : {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 100.0, -1.0}) h.Observe(v);
  h.Observe(NAN);  // +Inf bucket only
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{3, 2, 2, 2}));
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(MetricsRegistryTest, RemoveDropsOneSeries) {
  MetricsRegistry registry;
  GaugeFamily& family = registry.AddGauge("qpool_pipeline_bytes", "Bytes.", {"pipeline"});
  family.WithLabels({"sd-turbo"}).Set(1);
  family.WithLabels({"tiny"}).Set(2);
  EXPECT_TRUE(family.Remove({"sd-turbo"}));
  EXPECT_FALSE(family.Remove({"sd-turbo"}));
  const std::vector<FamilySnapshot> families = registry.Collect();
  const FamilySnapshot* snapshot = Find(families, "qpool_pipeline_bytes");
  ASSERT_NE(snapshot, nullptr);
  ASSERT_EQ(snapshot->samples.size(), 1u);
  EXPECT_EQ(snapshot->samples[0].labels, (MetricLabels{{"pipeline", "tiny"}}));
  // A removed series starts again from zero when used again.
  EXPECT_EQ(family.WithLabels({"sd-turbo"}).value(), 0);
  // A family whose last series is removed is left out of the scrape.
  family.Remove({"sd-turbo"});
  family.Remove({"tiny"});
  EXPECT_EQ(Find(registry.Collect(), "qpool_pipeline_bytes"), nullptr);
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAreExact) {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("qpool_c_total", "C.", {"device"}).WithLabels({"cpu"});
  Gauge& gauge = registry.AddGauge("qpool_g", "G.").WithLabels({});
  Histogram& histogram = registry.AddHistogram("qpool_h", "H.", {}, {0.5}).WithLabels({});
  GaugeFamily& lookups = registry.AddGauge("qpool_lookups", "L.", {"thread"});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        counter.Inc();
        gauge.Inc(2);
        gauge.Dec();
        histogram.Observe(i % 2 ? 1.0 : 0.25);
        if (i % 1000 == 0) lookups.WithLabels({std::to_string(t)}).Inc();
      }
    });
  }
  std::thread scraper([&] {
    for (int i = 0; i < 50; ++i) registry.Expose();
  });
  for (auto& thread : threads) thread.join();
  scraper.join();
  EXPECT_EQ(counter.value(), kThreads * kPerThread);
  EXPECT_EQ(gauge.value(), kThreads * kPerThread);
  EXPECT_EQ(histogram.bucket_counts(),
            (std::vector<uint64_t>{kThreads * kPerThread / 2, kThreads * kPerThread / 2}));
  EXPECT_EQ(histogram.sum(), kThreads * kPerThread * 0.625);
  EXPECT_EQ(lookups.series_count(), static_cast<size_t>(kThreads));
}

TEST(MetricsRegistryTest, CollectorsMergeIntoOneFamilySortedByLabels) {
  MetricsRegistry registry;
  registry.AddCollector([](SampleSink& sink) {
    sink.AddGauge("qpool_device_memory_free_bytes", "Free.", {{"device", "cuda:1"}}, 10);
  });
  registry.AddCollector([](SampleSink& sink) {
    sink.AddGauge("qpool_device_memory_free_bytes", "Free.", {{"device", "cuda:0"}}, 20);
    sink.AddCounter("qpool_allocator_ooms_total", "OOMs.", {{"device", "cuda:0"}}, 1);
  });
  const std::vector<FamilySnapshot> families = registry.Collect();
  ASSERT_EQ(families.size(), 2u);
  EXPECT_EQ(families[0].name, "qpool_allocator_ooms_total");  // sorted by name
  EXPECT_EQ(families[0].type, MetricType::kCounter);
  const FamilySnapshot& free = families[1];
  EXPECT_EQ(free.name, "qpool_device_memory_free_bytes");
  EXPECT_EQ(free.type, MetricType::kGauge);
  ASSERT_EQ(free.samples.size(), 2u);
  EXPECT_EQ(free.samples[0].labels, (MetricLabels{{"device", "cuda:0"}}));
  EXPECT_EQ(free.samples[0].value, 20);
  EXPECT_EQ(free.samples[1].labels, (MetricLabels{{"device", "cuda:1"}}));
}

TEST(MetricsRegistryTest, BadCollectedSamplesAreDropped) {
  MetricsRegistry registry;
  registry.AddGauge("qpool_registered", "Registered.").WithLabels({}).Set(1);
  registry.AddHistogram("qpool_h_seconds", "H.", {}, {1});
  registry.AddCollector([](SampleSink& sink) {
    sink.AddGauge("qpool_ok", "Ok.", {{"device", "cpu"}}, 1);
    sink.AddGauge("qpool_ok", "Ok.", {{"device", "cpu"}}, 2);            // repeated series
    sink.AddGauge("qpool_ok", "Different help.", {{"device", "x"}}, 3);  // help differs
    sink.AddCounter("qpool_ok", "Ok.", {{"device", "y"}}, 4);            // type differs
    sink.AddGauge("qpool_registered", "Registered.", {}, 5);             // registered name
    sink.AddGauge("qpool_h_seconds_sum", "Sum.", {}, 5);                 // a histogram's sample
    sink.AddGauge("bad-name", "Bad.", {}, 6);
    sink.AddGauge("qpool_bad_label", "Bad.", {{"__x", "1"}}, 7);
    sink.AddGauge("qpool_no_help", "", {}, 8);
  });
  registry.AddCollector([](SampleSink& sink) {
    sink.AddGauge("qpool_lost", "Lost.", {}, 1);
    throw std::runtime_error("device went away");
  });
  const std::vector<FamilySnapshot> families = registry.Collect();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "qpool_h_seconds");
  EXPECT_EQ(families[1].name, "qpool_ok");
  ASSERT_EQ(families[1].samples.size(), 1u);
  EXPECT_EQ(families[1].samples[0].value, 1);
  EXPECT_EQ(families[2].name, "qpool_registered");
  ASSERT_EQ(families[2].samples.size(), 1u);
  EXPECT_EQ(families[2].samples[0].value, 1);
}

TEST(MetricsRegistryTest, RemovedCollectorIsNotCalledAgain) {
  MetricsRegistry registry;
  int calls = 0;
  const MetricsRegistry::CollectorId id = registry.AddCollector([&calls](SampleSink& sink) {
    ++calls;
    sink.AddGauge("qpool_x", "X.", {}, 1);
  });
  EXPECT_NE(registry.Expose().find("qpool_x 1"), std::string::npos);
  EXPECT_TRUE(registry.RemoveCollector(id));
  EXPECT_FALSE(registry.RemoveCollector(id));
  EXPECT_EQ(registry.Expose(), "");
  EXPECT_EQ(calls, 1);
}

TEST(MetricsRegistryTest, CollectorMayRegisterFamilies) {
  MetricsRegistry registry;
  registry.AddCollector([&registry](SampleSink& sink) {
    registry.AddGauge("qpool_late", "Late.").WithLabels({}).Set(3);
    sink.AddGauge("qpool_collected", "Collected.", {}, 1);
  });
  EXPECT_EQ(registry.Collect().size(), 1u);  // the new family is read from the next scrape on
  EXPECT_EQ(registry.Collect().size(), 2u);
}

}  // namespace
}  // namespace qpool
