#include "memory/memory_metrics.h"

#include <optional>

#include "memory/memory_breakdown.h"

namespace qpool {

MemoryMetrics::MemoryMetrics(MetricsRegistry& metrics, const DeviceMemory& memory,
                             MemoryEventLog& events, std::vector<c10::Device> devices)
    : metrics_(metrics), memory_(memory), devices_(std::move(devices)) {
  auto& counts = metrics.AddCounter("qpool_memory_events_total",
                                    "Memory events (load, unload, offload, onload, move, stream, "
                                    "empty_cache, oom, leak) by outcome.",
                                    {"kind", "outcome"});
  auto& durations = metrics.AddHistogram(
      "qpool_memory_event_duration_seconds", "Duration of memory events.", {"kind"},
      {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  auto& leaked =
      metrics.AddCounter("qpool_vram_leaked_bytes_total",
                         "Bytes unload checks found not given back, by device.", {"device"});
  auto& streamed = metrics.AddCounter(
      "qpool_streamed_bytes_total",
      "Bytes copied from pinned host memory to a device while components ran under the "
      "sequential offload policy.",
      {"pipeline", "component", "device"});
  // Note [Counters start at zero] in pool/pool_metrics.cpp: 0 per device from the start.
  for (const auto& d : devices_) leaked.WithLabels({d.str()});
  // Every kind with every outcome, so that alerts on failed loads or moves see 0, not no data.
  for (int kind = 0; kind <= static_cast<int>(MemoryEventKind::kStream); ++kind) {
    for (int outcome = 0; outcome <= static_cast<int>(MemoryEventOutcome::kLeak); ++outcome) {
      counts.WithLabels({MemoryEventKindName(static_cast<MemoryEventKind>(kind)),
                         MemoryEventOutcomeName(static_cast<MemoryEventOutcome>(outcome))});
    }
  }
  events.AddListener([&counts, &durations, &leaked, &streamed](const MemoryEvent& e) {
    counts.WithLabels({MemoryEventKindName(e.kind), MemoryEventOutcomeName(e.outcome)}).Inc();
    durations.WithLabels({MemoryEventKindName(e.kind)}).Observe(e.duration_seconds);
    if (e.kind == MemoryEventKind::kLeak) {
      leaked.WithLabels({e.device}).Inc(static_cast<double>(e.leaked_bytes));
    }
    if (e.kind == MemoryEventKind::kStream && e.copied_bytes > 0) {
      streamed.WithLabels({e.pipeline, e.component, e.device})
          .Inc(static_cast<double>(e.copied_bytes));
    }
  });
  collector_ = metrics.AddCollector([this](SampleSink& sink) { Collect(sink); });
}

MemoryMetrics::~MemoryMetrics() { metrics_.RemoveCollector(collector_); }

void MemoryMetrics::Collect(SampleSink& sink) const {
  for (const auto& s : memory_.ReadAll(devices_)) {
    const MetricLabels device = {{"device", s.device}};
    auto gauge = [&](const char* name, const char* help, uint64_t v) {
      sink.AddGauge(name, help, device, static_cast<double>(v));
    };
    gauge("qpool_device_memory_allocated_bytes",
          "Bytes in use by tensors (caching allocator; host bytes of pipeline tensors for cpu).",
          s.allocated_bytes);
    gauge("qpool_device_memory_reserved_bytes",
          "Bytes the caching allocator holds from the driver.", s.reserved_bytes);
    gauge("qpool_device_memory_active_bytes", "Allocated bytes plus blocks waiting on streams.",
          s.active_bytes);
    gauge("qpool_device_memory_inactive_split_bytes", "Free parts of split blocks (fragmentation).",
          s.inactive_split_bytes);
    gauge("qpool_device_memory_requested_bytes", "Bytes callers asked for, before rounding.",
          s.requested_bytes);
    gauge("qpool_device_memory_peak_allocated_bytes",
          "Peak allocated bytes since start or the last reset.", s.peak_allocated_bytes);
    if (s.total_bytes > 0) {
      gauge("qpool_device_memory_total_bytes", "Device capacity.", s.total_bytes);
      gauge("qpool_device_memory_free_bytes", "Free device memory as the driver reports it.",
            s.free_bytes);
    }
    if (const c10::Device d(s.device); d.is_cuda()) CollectParts(sink, d, s);
    sink.AddCounter("qpool_device_alloc_retries_total",
                    "cudaMalloc retries after the cache was flushed.", device,
                    static_cast<double>(s.alloc_retries));
    sink.AddCounter("qpool_device_ooms_total", "Out-of-memory errors the allocator raised.", device,
                    static_cast<double>(s.ooms));
  }
  sink.AddGauge("qpool_pinned_host_memory_bytes", "Pinned host memory held for offload copies.", {},
                static_cast<double>(memory_.pinned_bytes()));
}

void MemoryMetrics::CollectParts(SampleSink& sink, const c10::Device& device,
                                 const DeviceMemoryStats& stats) const {
  const MetricLabels labels = {{"device", stats.device}};
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    sink.AddGauge(name, help, labels, static_cast<double>(v));
  };
  // Note [Memory arithmetic] in memory_breakdown.h; docs/metrics.md says how the series add up.
  const AllocatorParts parts = memory_.ReadParts(device);
  gauge("qpool_device_memory_workspace_bytes",
        "cuBLAS and cuBLASLt workspaces (allocated, kept for the process's life).",
        parts.workspace_bytes);
  gauge("qpool_device_memory_graph_pool_allocated_bytes",
        "Bytes in use in the pipelines' CUDA graph pools.", parts.graph_pool_allocated_bytes);
  gauge("qpool_device_memory_graph_pool_reserved_bytes",
        "Bytes the pipelines' CUDA graph pools hold, in use or not.",
        parts.graph_pool_reserved_bytes);
  const std::optional<DriverView> driver = memory_.ReadDriver(device);
  if (!driver) return;  // absent, not zero, without the driver's figures
  gauge("qpool_device_driver_used_bytes",
        "The GPU's used memory as the driver counts it, every process (nvidia-smi).",
        driver->reading.used_bytes);
  gauge("qpool_device_driver_total_bytes", "The GPU's memory as the driver counts it.",
        driver->reading.total_bytes);
  if (!driver->reading.process_bytes) return;
  gauge("qpool_device_driver_process_bytes",
        "This process's memory on the GPU as the driver counts it (nvidia-smi's per-process "
        "figure).",
        *driver->reading.process_bytes);
  if (!driver->context_bytes) return;
  const MemoryBreakdown b = BreakDown(stats, parts, 0, driver);
  gauge("qpool_device_cuda_context_bytes",
        "The CUDA context and what start-up loaded, measured before any pipeline loaded.",
        *b.context_bytes);
  gauge("qpool_device_memory_outside_allocator_bytes",
        "Driver bytes of this process outside the caching allocator and the context: library "
        "handles, lazily loaded kernels.",
        *b.outside_bytes);
}

}  // namespace qpool
