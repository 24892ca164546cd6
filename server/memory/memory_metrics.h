// MemoryMetrics: exports device memory and memory events to the metrics registry (the bytes of
// each pipeline are the pool's: PoolMetrics).
#pragma once

#include <c10/core/Device.h>

#include <vector>

#include "memory/device_memory.h"
#include "memory/memory_event_log.h"
#include "metrics/metrics_registry.h"

namespace qpool {

// Registers the memory families and a scrape-time collector (device counters are read at each
// scrape, so /metrics is current after every load, unload and move), and counts each memory
// event as it is appended. Removes its collector on destruction.
// Thread safety: built once on the main thread; the collector and listener run on any thread.
class MemoryMetrics {
 public:
  MemoryMetrics(MetricsRegistry& metrics, const DeviceMemory& memory, MemoryEventLog& events,
                std::vector<c10::Device> devices);
  ~MemoryMetrics();
  MemoryMetrics(const MemoryMetrics&) = delete;
  MemoryMetrics& operator=(const MemoryMetrics&) = delete;

 private:
  void Collect(SampleSink& sink) const;
  // A GPU's named parts and the driver's view (absent without it).
  void CollectParts(SampleSink& sink, const c10::Device& device,
                    const DeviceMemoryStats& stats) const;

  MetricsRegistry& metrics_;
  const DeviceMemory& memory_;
  const std::vector<c10::Device> devices_;
  MetricsRegistry::CollectorId collector_ = 0;
};

}  // namespace qpool
