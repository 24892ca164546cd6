// FailingAllocator: an ArenaAllocator that fails one chosen allocation, for the all-or-nothing
// tests of moves and streaming.
#pragma once

#include "memory/arena_allocator.h"
#include "util/log.h"

namespace qpool::testing {

class FailingAllocator : public ArenaAllocator {
 public:
  // Fails the `fail_at`-th (1-based) counted allocation with ResourceExhausted. Counted: those on
  // another device than the CPU, or every one with `count_cpu`; none until `armed`.
  explicit FailingAllocator(int fail_at, bool count_cpu = false)
      : fail_at_(fail_at), count_cpu_(count_cpu) {}

  StatusOr<ArenaBlock> Allocate(const c10::Device& device, uint64_t size, bool pinned) override {
    if (armed && (count_cpu_ || !device.is_cpu()) && ++counted_ == fail_at_) {
      return ResourceExhausted(StrCat("injected: out of memory on ", device.str()));
    }
    return ArenaAllocator::Allocate(device, size, pinned);
  }

  bool armed = true;

 private:
  const int fail_at_;
  const bool count_cpu_;
  int counted_ = 0;
};

}  // namespace qpool::testing
