// StreamPlan: a component's tensors split into groups that are streamed to the device one after
// another while its forward runs (the `sequential` offload policy).
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "component/component.h"
#include "residency/arena_layout.h"
#include "util/status.h"

namespace qpool {

// Note [Streaming]
// Under the `sequential` policy a component is never whole on the device. Its tensors are split
// into groups along its module tree: a module whose tensors (its own and its submodules') fit in
// group_bytes is one group; a larger module's own tensors form a group and its children are split
// the same way (group_bytes 0: one group per module that holds tensors). At load, qpool inserts
// two ops into the forward of every module that brings a group: qpool::stream_enter(self) first
// and qpool::stream_exit(self) before it returns (component/stream_ops.h). While the component
// runs, enter binds the group's tensors to a device copy (copied from the pinned host copy on the
// copy stream unless it was prefetched) and starts copying the next groups; exit binds the host
// tensors back and gives the device copy to the caching allocator, whose stream order keeps it
// alive for the kernels already queued (ComponentStreamer, Note [Stream ordering]). The order of
// the groups is learned from the enters of the previous pass (module order before the first),
// so prefetch follows the real execution order and wraps from the last group to the first for
// the next denoising step.
//
// This is sound only if a group's tensors are read while its module's forward runs, which
// StreamPlan::Make checks on the graphs before it instruments them: every tensor attribute is
// read from `self`, and a submodule is only called through its `forward`, reached from `self`
// through containers without methods (ModuleList). A component that breaks a rule is refused,
// naming the method and node. The host copy's layout puts each group's tensors in one contiguous
// range (ArenaLayout::Plan with SlotOrder()), so a group moves in one copy.

// One streamed group.
struct StreamGroup {
  std::string module;                          // qualified name of its entry module ("" = root)
  const c10::ivalue::Object* entry = nullptr;  // the module whose forward brings it in
  std::vector<size_t> slots;                   // the component's slot indices
  int64_t begin = 0;                           // byte range in the host block (SetRanges)
  int64_t end = 0;
};

class StreamPlan {
 public:
  // Splits `component`'s slots into groups of at most `group_bytes` where the module tree allows
  // (Note [Streaming]); `slot_bytes[i]` is what slot i takes in the layout. Checks that the
  // component can be streamed and instruments the forward of every group's entry module (before
  // the component's first forward: executors copy the graphs on their first run).
  // InvalidArgument naming the component and the method or node otherwise.
  static StatusOr<StreamPlan> Make(Component& component, const std::vector<int64_t>& slot_bytes,
                                   uint64_t group_bytes);

  const std::vector<StreamGroup>& groups() const { return groups_; }
  // Every slot index once: the groups' slots in group order, then slots no forward reads.
  const std::vector<size_t>& slot_order() const { return slot_order_; }
  // Fills each group's byte range from a layout planned in slot_order().
  void SetRanges(const ArenaLayout& layout);
  // The index of the group `module`'s forward brings in, or -1.
  int GroupOf(const c10::ivalue::Object& module) const;

 private:
  std::vector<StreamGroup> groups_;
  std::vector<size_t> slot_order_;
  std::unordered_map<const c10::ivalue::Object*, int> group_of_;
};

}  // namespace qpool
