// MemoryBreakdown: how a GPU's figures add up, from the allocator's counters and parts, the
// pipelines' attributed bytes and the driver's view (Note [Memory arithmetic]).
#pragma once

#include <cstdint>
#include <optional>

#include "memory/device_memory.h"

namespace qpool {

// Note [Memory arithmetic]
// Every byte the driver counts for the process on a GPU is in one named figure:
//   allocated = tensors + graph pools in use + workspaces + working
//   reserved  = allocated + cached
//   driver    = reserved + context + outside
// - tensors: the loaded pipelines' tensors on the GPU (weights, quant state, buffers, the static
//   inputs of their graphs), i.e. their attributed bytes less their graphs' memory pools (the
//   private pools: every private pool belongs to a pipeline's graph cache);
// - graph pools in use: allocated blocks of those pools (a replayed graph's outputs and
//   intermediates); reserved by the pools, allocated or not, is graph_pool_reserved;
// - workspaces: cuBLAS and cuBLASLt workspaces, one per (handle, stream), created by the first
//   matrix product and kept for the process's life, in whatever pool was current then;
// - working: the rest of allocated, what requests in flight use. 0 when the GPU is idle: any
//   other value when idle is memory no pipeline, graph or library owns (a leak);
// - cached: free blocks the allocator keeps for reuse (EmptyCache gives back what is not a graph
//   pool's);
// - context: the CUDA context and what start-up loaded, measured once before any pipeline;
// - outside: the rest of the driver's figure, what the libraries allocated behind the allocator
//   (handles, lazily loaded kernels, cuDNN's and cuBLASLt's internal state).
// Parts that cannot be negative are clamped at 0, so a double count shows as a sum that exceeds
// its total: the GPU tests check each sum to 2 MiB.
struct MemoryBreakdown {
  uint64_t tensor_bytes = 0;
  uint64_t graph_pool_allocated_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint64_t working_bytes = 0;
  uint64_t graph_pool_reserved_bytes = 0;
  uint64_t cached_bytes = 0;
  // The driver's view; absent without NVML or where it does not list this process.
  std::optional<uint64_t> driver_process_bytes;
  std::optional<uint64_t> driver_used_bytes;  // every process's
  std::optional<uint64_t> driver_total_bytes;
  std::optional<uint64_t> context_bytes;
  std::optional<uint64_t> outside_bytes;
};

// The breakdown of one GPU. `pipeline_bytes` is what the loaded pipelines hold on it (their
// attributed bytes, graph pools included).
MemoryBreakdown BreakDown(const DeviceMemoryStats& stats, const AllocatorParts& parts,
                          uint64_t pipeline_bytes, const std::optional<DriverView>& driver);

}  // namespace qpool
