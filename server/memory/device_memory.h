// DeviceMemory: reads what each device's caching allocator and driver report, resets peaks and
// releases cached blocks. The CPU reports the host bytes of pipeline tensors.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memory/arena_allocator.h"
#include "memory/driver_memory.h"
#include "util/status.h"

namespace qpool {

struct DeviceMemoryStats {
  std::string device;
  // GPUs: the caching allocator's counters. CPU: host bytes of pipeline tensors (allocated ==
  // reserved == active; Note [Host memory accounting]).
  uint64_t allocated_bytes = 0;       // in use by tensors
  uint64_t reserved_bytes = 0;        // held from the driver
  uint64_t active_bytes = 0;          // allocated plus blocks waiting on streams
  uint64_t inactive_split_bytes = 0;  // free parts of split blocks (fragmentation)
  uint64_t requested_bytes = 0;       // what callers asked for, before rounding
  uint64_t peak_allocated_bytes = 0;  // since start or the last ResetPeak
  uint64_t alloc_retries = 0;         // cudaMalloc retries after freeing the cache
  uint64_t ooms = 0;                  // out-of-memory errors the allocator raised
  uint64_t total_bytes = 0;           // device capacity (0 for the CPU)
  uint64_t free_bytes = 0;            // driver's free memory (0 for the CPU)
};

// What of a GPU's allocation the caching allocator can name (Note [Memory arithmetic] in
// memory_breakdown.h).
struct AllocatorParts {
  uint64_t graph_pool_reserved_bytes = 0;   // segments of private pools: CUDA graphs' memory
  uint64_t graph_pool_allocated_bytes = 0;  // in use in them (workspaces aside)
  uint64_t workspace_bytes = 0;             // cuBLAS and cuBLASLt workspaces, any pool
};

// The driver's view of a GPU (Note [Driver memory] in driver_memory.h).
struct DriverView {
  DriverReading reading;
  // The CUDA context and what start-up loaded outside the allocator: this process's driver
  // figure less the allocator's reserved bytes when the server started, before any pipeline.
  // Absent where the driver does not list this process.
  std::optional<uint64_t> context_bytes;
};

// Thread safety: every method may be called from any thread (the allocator's statistics are
// thread-safe), except MeasureContexts, which runs once before the server serves. GPUs must have
// had a first allocation (DevicePool::Create does it).
class DeviceMemory {
 public:
  // `driver` may be null (no driver figures); it outlives this.
  explicit DeviceMemory(const ArenaAllocator& arenas, const DriverMemory* driver = nullptr)
      : arenas_(arenas), driver_(driver) {}
  virtual ~DeviceMemory() = default;

  // One device's counters. Virtual, like ResetPeak, so tests can stand in for a GPU.
  virtual DeviceMemoryStats Read(const c10::Device& device) const;
  // The parts of `device`'s allocation, from a walk of the allocator's segments (under its lock,
  // about a millisecond for a large pipeline): for reports and scrapes, not for every event.
  // Zeros for the CPU.
  virtual AllocatorParts ReadParts(const c10::Device& device) const;
  // The driver's figures for a GPU; nullopt for the CPU or without them.
  virtual std::optional<DriverView> ReadDriver(const c10::Device& device) const;
  // Records each GPU's context size (DriverView::context_bytes). Call once, after the devices'
  // first allocation and before any pipeline loads.
  void MeasureContexts(const std::vector<c10::Device>& devices);
  // One entry per device, in order.
  std::vector<DeviceMemoryStats> ReadAll(const std::vector<c10::Device>& devices) const;
  // Sets the peak of `device` to its current allocation (per-request peaks).
  virtual void ResetPeak(const c10::Device& device) const;
  // Releases the caching allocator's unused cached blocks (every GPU's); returns nothing on CPU.
  void EmptyCache() const;
  // Pinned host bytes of offload copies.
  uint64_t pinned_bytes() const { return arenas_.pinned_bytes(); }

 private:
  const ArenaAllocator& arenas_;
  const DriverMemory* driver_;
  std::map<c10::DeviceIndex, std::string> bus_ids_;     // written by MeasureContexts only
  std::map<c10::DeviceIndex, uint64_t> context_bytes_;  // likewise
};

}  // namespace qpool
