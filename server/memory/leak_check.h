// LeakCheck: whether dropping a pipeline gave every byte of its blocks back (Note [Leak check]).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "memory/device_memory.h"

namespace qpool {

// A block a pipeline holds, referenced weakly, so the check sees whether anything still holds it.
struct HeldBlock {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::Device device{c10::kCPU};
  uint64_t bytes = 0;            // block size
  uint64_t allocator_bytes = 0;  // what the device's allocator counted for it
};

// What a check found.
struct LeakReport {
  uint64_t retained_bytes = 0;   // in blocks something still references
  uint64_t shortfall_bytes = 0;  // expected back on a GPU and not returned to its allocator
  uint64_t leaked_bytes() const {
    return retained_bytes > shortfall_bytes ? retained_bytes : shortfall_bytes;
  }
};

// Note [Leak check]
// Unload drops every tensor of a replica and then compares, per device, the drop of the
// allocator's allocated bytes with what the replica's blocks held (as the allocator counted them
// when they were allocated). Unload runs on the device's worker, so nothing else allocates on
// that device meanwhile; a drop smaller than expected is a leak, and so is a block something
// still references: an error log, a `leak` event carrying the bytes (MemoryEvent::leaked_bytes)
// and qpool_vram_leaked_bytes_total. The CPU's counters are read too, against the host bytes of
// pipeline tensors (Note [Host memory accounting]).
//
// Thread safety: none; one check belongs to the unload that makes it.
class LeakCheck {
 public:
  // Right before the last reference to `blocks` is dropped: reads the counters of the CPU, of
  // every device the blocks are on, and of `home` (the replica's device). `memory` may be null
  // (only retained blocks are then found).
  LeakCheck(const DeviceMemory* memory, std::vector<HeldBlock> blocks, const c10::Device& home);
  // Right after: what did not come back.
  LeakReport Finish() const;
  // The devices whose counters were read, the CPU first.
  const std::vector<c10::Device>& devices() const { return devices_; }
  // The counters of `device` (one of devices()) before the drop.
  DeviceMemoryStats before(const c10::Device& device) const;

 private:
  const DeviceMemory* memory_;
  std::vector<HeldBlock> blocks_;
  std::map<std::string, uint64_t> expected_;  // allocator bytes per GPU
  std::vector<c10::Device> devices_;
  std::map<std::string, DeviceMemoryStats> before_;
};

}  // namespace qpool
