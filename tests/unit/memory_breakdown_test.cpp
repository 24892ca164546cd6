// Note [Memory arithmetic] on made-up figures: how allocated, reserved and the driver's figure
// split into named parts, what is absent without the driver, and the metrics a GPU's parts
// become (a stand-in DeviceMemory plays the GPU, so this runs on the CPU).
#include "memory/memory_breakdown.h"

#include <gtest/gtest.h>

#include <cmath>

#include "memory/arena_allocator.h"
#include "memory/memory_metrics.h"
#include "testing/metric_samples.h"

namespace qpool {
namespace {

using ::qpool::testing::SampleValue;

constexpr uint64_t kMiB = 1 << 20;

DeviceMemoryStats Gpu(uint64_t allocated, uint64_t reserved) {
  DeviceMemoryStats s;
  s.device = "cuda:0";
  s.allocated_bytes = allocated;
  s.reserved_bytes = reserved;
  s.total_bytes = 80000 * kMiB;
  return s;
}

TEST(MemoryBreakdown, AllocatedSplitsIntoTensorsGraphPoolsWorkspacesAndWorking) {
  // A pipeline of 1000 MiB attributed, 100 MiB of which are its graphs' pool (60 in use).
  AllocatorParts parts;
  parts.graph_pool_reserved_bytes = 100 * kMiB;
  parts.graph_pool_allocated_bytes = 60 * kMiB;
  parts.workspace_bytes = 33 * kMiB;
  const MemoryBreakdown b = BreakDown(Gpu(1100 * kMiB, 1300 * kMiB), parts, 1000 * kMiB, {});
  EXPECT_EQ(b.tensor_bytes, 900 * kMiB);
  EXPECT_EQ(b.graph_pool_allocated_bytes, 60 * kMiB);
  EXPECT_EQ(b.workspace_bytes, 33 * kMiB);
  EXPECT_EQ(b.working_bytes, (1100 - 900 - 60 - 33) * kMiB);
  EXPECT_EQ(b.graph_pool_reserved_bytes, 100 * kMiB);
  EXPECT_EQ(b.cached_bytes, 200 * kMiB);
  // Without the driver's figures they are absent, not zero.
  EXPECT_FALSE(b.driver_process_bytes || b.driver_used_bytes || b.driver_total_bytes ||
               b.context_bytes || b.outside_bytes);
}

TEST(MemoryBreakdown, AfterTheLastUnloadOnlyTheWorkspacesAreAllocated) {
  AllocatorParts parts;
  parts.workspace_bytes = 33 * kMiB;
  const MemoryBreakdown b = BreakDown(Gpu(33 * kMiB, 40 * kMiB), parts, 0, {});
  EXPECT_EQ(b.tensor_bytes, 0u);
  EXPECT_EQ(b.working_bytes, 0u) << "no unowned byte: the 33 MiB are the workspaces";
}

TEST(MemoryBreakdown, ADoubleCountShowsAsPartsOverAllocatedNotAsNegativeWorking) {
  AllocatorParts parts;
  parts.workspace_bytes = 50 * kMiB;
  const MemoryBreakdown b = BreakDown(Gpu(100 * kMiB, 100 * kMiB), parts, 80 * kMiB, {});
  EXPECT_EQ(b.working_bytes, 0u);
  EXPECT_GT(b.tensor_bytes + b.workspace_bytes, 100 * kMiB);
}

TEST(MemoryBreakdown, TheDriversFigureIsReservedPlusContextPlusOutside) {
  DriverView driver;
  driver.reading.process_bytes = 2000 * kMiB;
  driver.reading.used_bytes = 5000 * kMiB;
  driver.reading.total_bytes = 80000 * kMiB;
  driver.context_bytes = 520 * kMiB;
  const MemoryBreakdown b = BreakDown(Gpu(1000 * kMiB, 1400 * kMiB), {}, 0, driver);
  EXPECT_EQ(*b.driver_process_bytes, 2000 * kMiB);
  EXPECT_EQ(*b.driver_used_bytes, 5000 * kMiB);
  EXPECT_EQ(*b.driver_total_bytes, 80000 * kMiB);
  EXPECT_EQ(*b.context_bytes, 520 * kMiB);
  EXPECT_EQ(*b.outside_bytes, 80 * kMiB);
  // Where the driver does not list this process (another PID namespace), only its device-wide
  // figures are there.
  driver.reading.process_bytes.reset();
  driver.context_bytes.reset();
  const MemoryBreakdown unlisted = BreakDown(Gpu(1000 * kMiB, 1400 * kMiB), {}, 0, driver);
  EXPECT_TRUE(unlisted.driver_used_bytes.has_value());
  EXPECT_FALSE(unlisted.driver_process_bytes || unlisted.context_bytes || unlisted.outside_bytes);
}

TEST(DriverMemory, OpeningNeverFailsAndACpuHasNoDriverFigures) {
  // With or without libnvidia-ml.so.1 on this machine.
  const auto driver = DriverMemory::Open();
  ASSERT_NE(driver, nullptr);
  ArenaAllocator arenas;
  DeviceMemory memory(arenas, driver.get());
  EXPECT_FALSE(memory.ReadDriver(c10::Device(c10::kCPU)).has_value());
  if (!driver->available()) {
    EXPECT_FALSE(driver->Read("0000:00:00.0").has_value());
  }
}

// A GPU with fixed figures; `driver` unset plays a machine without NVML.
class FakeGpuMemory : public DeviceMemory {
 public:
  FakeGpuMemory(const ArenaAllocator& arenas, std::optional<DriverView> driver)
      : DeviceMemory(arenas), driver_(std::move(driver)) {}
  DeviceMemoryStats Read(const c10::Device& device) const override {
    if (device.is_cpu()) return DeviceMemory::Read(device);
    return Gpu(100 * kMiB, 140 * kMiB);
  }
  AllocatorParts ReadParts(const c10::Device&) const override {
    AllocatorParts parts;
    parts.workspace_bytes = 33 * kMiB;
    parts.graph_pool_reserved_bytes = 20 * kMiB;
    parts.graph_pool_allocated_bytes = 12 * kMiB;
    return parts;
  }
  std::optional<DriverView> ReadDriver(const c10::Device&) const override { return driver_; }

 private:
  std::optional<DriverView> driver_;
};

double Gauge(const MetricsRegistry& registry, const char* name) {
  return SampleValue(registry, name, {{"device", "cuda:0"}});
}

TEST(MemoryMetrics, AGpusPartsAndTheDriversViewAreGauges) {
  ArenaAllocator arenas;
  DriverView driver;
  driver.reading = {600 * kMiB, 900 * kMiB, 80000 * kMiB};
  driver.context_bytes = 400 * kMiB;
  FakeGpuMemory memory(arenas, driver);
  MetricsRegistry registry;
  MemoryEventLog events;
  MemoryMetrics metrics(registry, memory, events, {c10::Device(c10::kCUDA, 0)});
  EXPECT_EQ(Gauge(registry, "qpool_device_memory_workspace_bytes"), 33.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_memory_graph_pool_allocated_bytes"), 12.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_memory_graph_pool_reserved_bytes"), 20.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_driver_process_bytes"), 600.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_driver_used_bytes"), 900.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_driver_total_bytes"), 80000.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_cuda_context_bytes"), 400.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_memory_outside_allocator_bytes"), 60.0 * kMiB);
}

TEST(MemoryMetrics, WithoutTheDriverItsSeriesAreAbsentAndTheRestIsThere) {
  ArenaAllocator arenas;
  FakeGpuMemory memory(arenas, std::nullopt);
  MetricsRegistry registry;
  MemoryEventLog events;
  MemoryMetrics metrics(registry, memory, events, {c10::Device(c10::kCUDA, 0)});
  EXPECT_EQ(Gauge(registry, "qpool_device_memory_allocated_bytes"), 100.0 * kMiB);
  EXPECT_EQ(Gauge(registry, "qpool_device_memory_workspace_bytes"), 33.0 * kMiB);
  for (const char* name :
       {"qpool_device_driver_process_bytes", "qpool_device_driver_used_bytes",
        "qpool_device_cuda_context_bytes", "qpool_device_memory_outside_allocator_bytes"}) {
    EXPECT_TRUE(std::isnan(Gauge(registry, name))) << name << " should be absent";
  }
}

}  // namespace
}  // namespace qpool
