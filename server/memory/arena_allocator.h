// ArenaAllocator: allocates the blocks that hold components' tensors (one block per component and
// place) and accounts the host memory they use.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "util/status.h"

namespace qpool {

// Note [Host memory accounting]
// A GPU's bytes are the caching allocator's counters. Host memory has no such counters, so every
// host block of component tensors comes from here, with a deleter that gives its bytes back:
// cpu_bytes() is then exactly the host memory pipeline tensors hold (what a CPU deployment
// reports as its device's allocated bytes) and pinned_bytes() the page-locked offload copies.
// Pinned blocks come from cudaHostAlloc, not PyTorch's caching host allocator, which rounds to
// powers of two and keeps freed blocks: an unloaded pipeline gives its pinned memory back.
struct ArenaBlock {
  torch::Tensor bytes;           // uint8, [size]
  uint64_t allocator_bytes = 0;  // what the device's allocator counted for it (GPU), or size
};

// Thread safety: Allocate may be called from any thread; counters are atomic.
class ArenaAllocator {
 public:
  ArenaAllocator();
  virtual ~ArenaAllocator() = default;
  ArenaAllocator(const ArenaAllocator&) = delete;
  ArenaAllocator& operator=(const ArenaAllocator&) = delete;

  // A block of `size` bytes on `device` (CPU: page-locked when `pinned`). ResourceExhausted when
  // the device is out of memory, naming the device and size. Virtual so tests can inject failures.
  virtual StatusOr<ArenaBlock> Allocate(const c10::Device& device, uint64_t size, bool pinned);

  // Host bytes held by blocks now (pageable and pinned), and the pinned part.
  uint64_t cpu_bytes() const { return counters_->cpu.load(); }
  uint64_t pinned_bytes() const { return counters_->pinned.load(); }

 private:
  struct Counters {
    std::atomic<uint64_t> cpu{0};
    std::atomic<uint64_t> pinned{0};
  };
  std::shared_ptr<Counters> counters_;  // shared with the blocks' deleters, which may outlive us
};

}  // namespace qpool
