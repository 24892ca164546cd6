#include "memory/memory_breakdown.h"

namespace qpool {

namespace {

uint64_t Less(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

MemoryBreakdown BreakDown(const DeviceMemoryStats& stats, const AllocatorParts& parts,
                          uint64_t pipeline_bytes, const std::optional<DriverView>& driver) {
  MemoryBreakdown b;
  b.tensor_bytes = Less(pipeline_bytes, parts.graph_pool_reserved_bytes);
  b.graph_pool_allocated_bytes = parts.graph_pool_allocated_bytes;
  b.graph_pool_reserved_bytes = parts.graph_pool_reserved_bytes;
  b.workspace_bytes = parts.workspace_bytes;
  b.working_bytes = Less(stats.allocated_bytes,
                         b.tensor_bytes + b.graph_pool_allocated_bytes + b.workspace_bytes);
  b.cached_bytes = Less(stats.reserved_bytes, stats.allocated_bytes);
  if (!driver) return b;
  b.driver_used_bytes = driver->reading.used_bytes;
  b.driver_total_bytes = driver->reading.total_bytes;
  b.driver_process_bytes = driver->reading.process_bytes;
  b.context_bytes = driver->context_bytes;
  if (b.driver_process_bytes && b.context_bytes) {
    b.outside_bytes = Less(*b.driver_process_bytes, stats.reserved_bytes + *b.context_bytes);
  }
  return b;
}

}  // namespace qpool
