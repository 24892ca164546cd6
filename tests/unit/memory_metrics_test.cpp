// MemoryMetrics: memory events become counters as they are appended (the leaked bytes from the
// event's number, whatever its text says) and device counters are read at scrape time.
#include "memory/memory_metrics.h"

#include <gtest/gtest.h>

#include "memory/arena_allocator.h"
#include "testing/metric_samples.h"

namespace qpool {
namespace {

using ::qpool::testing::SampleValue;

TEST(MemoryMetrics, LeakEventsCountTheirBytesAndEveryEventItsKind) {
  MetricsRegistry registry;
  ArenaAllocator arenas;
  DeviceMemory memory(arenas);
  MemoryEventLog events;
  MemoryMetrics metrics(registry, memory, events, {c10::Device(c10::kCPU)});
  // Note [Counters start at zero]: the series exists before any leak.
  EXPECT_EQ(SampleValue(registry, "qpool_vram_leaked_bytes_total", {{"device", "cpu"}}), 0);
  // ... and so does every kind of memory event with every outcome (alerts on failed loads).
  for (const char* kind : {"load", "move", "stream", "oom"}) {
    for (const char* outcome : {"ok", "error", "leak"}) {
      EXPECT_EQ(SampleValue(registry, "qpool_memory_events_total",
                            {{"kind", kind}, {"outcome", outcome}}),
                0)
          << kind << " " << outcome;
    }
  }

  MemoryEvent leak;
  leak.kind = MemoryEventKind::kLeak;
  leak.outcome = MemoryEventOutcome::kLeak;
  leak.device = "cuda:1";
  leak.leaked_bytes = 4096;
  leak.message = "the text is for people: 12 is not the count";
  events.Append(leak);
  leak.leaked_bytes = 512;
  events.Append(leak);
  MemoryEvent load;
  load.kind = MemoryEventKind::kLoad;
  load.device = "cpu";
  events.Append(load);

  EXPECT_EQ(SampleValue(registry, "qpool_vram_leaked_bytes_total", {{"device", "cuda:1"}}), 4608);
  EXPECT_EQ(
      SampleValue(registry, "qpool_memory_events_total", {{"kind", "leak"}, {"outcome", "leak"}}),
      2);
  EXPECT_EQ(
      SampleValue(registry, "qpool_memory_events_total", {{"kind", "load"}, {"outcome", "ok"}}), 1);
  EXPECT_EQ(SampleValue(registry, "qpool_device_memory_allocated_bytes", {{"device", "cpu"}}), 0);
}

}  // namespace
}  // namespace qpool
