// ComponentStreamer: runs a component's forwards with its tensor groups streamed from the host
// copy to a device, a few at a time (Note [Streaming] in residency/stream_plan.h).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "component/component.h"
#include "component/stream_ops.h"
#include "memory/arena_allocator.h"
#include "residency/arena_layout.h"
#include "residency/block_copy.h"
#include "residency/stream_plan.h"

namespace qpool {

// What a streamer did between its creation and Finish().
struct StreamStats {
  uint64_t bytes_copied = 0;  // host -> device
  uint64_t copies = 0;        // group copies
  uint64_t peak_bytes = 0;    // most bytes of device copies held at once
  uint64_t enters = 0;        // groups brought in (stream_enter calls that found a group)
};

// Where a component's groups run, learned across its streamers: the group entered after each
// group (wrapping to the next pass) and the first one entered.
struct StreamOrder {
  std::vector<int> next;
  int first = 0;
};

// Note [Stream ordering]
// Device copies are allocated by the calling (compute) stream's caching allocator and filled on
// the copy stream, which first waits for everything the compute stream has queued (BlockCopier).
// Enter makes the compute stream wait for the group's copy before any kernel can read it. Exit
// returns the device copy to the allocator at once: the allocator hands that memory only to
// later allocations of the compute stream, whose work is queued after the kernels that read the
// group, and a copy into it waits for those kernels too. The host thread may therefore run ahead
// of the GPU by any number of groups while the allocator never holds more than the groups in use
// plus `prefetch` ahead (plus the kept groups). A prefetched copy that is never used is waited
// for on the compute stream before its memory goes back.
//
// Thread safety: the device worker's only (its forwards call Enter and Exit on that thread).
class ComponentStreamer : public StreamHooks {
 public:
  // `host` is the component's host block laid out by `layout`; `plan`'s ranges index it.
  // The first groups of the learned order that fit in `keep_bytes` stay on the device once
  // brought in, until Finish. `order` outlives the streamer and is updated as groups are
  // entered; `resident` (read by other threads) follows the bytes of device copies held.
  ComponentStreamer(Component& component, const StreamPlan& plan, const ArenaLayout& layout,
                    const torch::Tensor& host, const c10::Device& device, int prefetch,
                    uint64_t keep_bytes, ArenaAllocator& arenas, BlockCopier& copier,
                    StreamOrder& order, std::atomic<uint64_t>& resident);
  ~ComponentStreamer() override;
  ComponentStreamer(const ComponentStreamer&) = delete;
  ComponentStreamer& operator=(const ComponentStreamer&) = delete;

  // Starts copying the first `prefetch` groups of the learned order (before the forward).
  void Warm();
  void Enter(const c10::ivalue::Object& module) override;
  void Exit(const c10::ivalue::Object& module) override;
  // Binds every tensor back to the host copy and gives every device copy back.
  void Finish();

  const StreamStats& stats() const { return stats_; }
  const c10::Device& device() const { return device_; }

 private:
  struct GroupState {
    std::optional<ArenaBlock> block;
    PendingCopy copy;
    int depth = 0;       // forwards of its entry module running (nested calls)
    bool bound = false;  // the slots view `block`
    bool keep = false;   // stays until Finish (within keep_bytes)
  };
  // Allocates and starts copying group g unless it has a device copy. Throws c10::Error (its
  // message says "out of memory" when the device is full) on failure.
  void Fetch(int g);
  void Release(int g);

  Component& component_;
  const StreamPlan& plan_;
  const ArenaLayout& layout_;
  const torch::Tensor host_;
  const c10::Device device_;
  const int prefetch_;
  ArenaAllocator& arenas_;
  BlockCopier& copier_;
  StreamOrder& order_;
  std::atomic<uint64_t>& resident_;
  std::vector<torch::Tensor> host_views_;  // slot order
  std::vector<GroupState> groups_;
  int last_entered_ = -1;
  bool entered_any_ = false;
  uint64_t resident_bytes_ = 0;
  StreamStats stats_;
};

}  // namespace qpool
