// DeviceMemory: reads what each device's caching allocator and driver report, resets peaks and
// releases cached blocks. The CPU reports the host bytes of pipeline tensors.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "memory/arena_allocator.h"
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

// Thread safety: every method may be called from any thread (the allocator's statistics are
// thread-safe). GPUs must have had a first allocation (DevicePool::Create does it).
class DeviceMemory {
 public:
  explicit DeviceMemory(const ArenaAllocator& arenas) : arenas_(arenas) {}
  virtual ~DeviceMemory() = default;

  // One device's counters. Virtual, like ResetPeak, so tests can stand in for a GPU.
  virtual DeviceMemoryStats Read(const c10::Device& device) const;
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
};

}  // namespace qpool
