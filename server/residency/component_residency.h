// ComponentResidency: the residency state of one component and the moves between states.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <optional>
#include <string>

#include "component/component.h"
#include "memory/arena_allocator.h"
#include "memory/leak_check.h"
#include "residency/arena_layout.h"
#include "residency/block_copy.h"
#include "residency/component_streamer.h"
#include "residency/residency_state.h"
#include "residency/stream_plan.h"
#include "util/log.h"
#include "util/status.h"

namespace qpool {

// What one move did.
struct ComponentMove {
  std::string component;
  std::string from;  // "host" or a device ("cuda:0")
  std::string to;
  uint64_t bytes = 0;
  double seconds = 0;
  size_t tensors_checked = 0;  // tensors verified on `to` afterwards
};

// Note [The host copy is the master]
// Components are immutable while they serve (no request writes a weight), so a host copy, once
// made, stays valid: onload copies host -> device and offload just drops the device copy. Only
// the first offload of a component that has no host copy copies device -> host. Under the
// `none` policy a load onto a GPU makes no host copy (Note [Loads straight to the GPU]); under
// the others it is pinned and kept for the pipeline's life.
//
// Note [Loads straight to the GPU]
// A host block is fresh memory, and the first write to each of its 4 KiB pages is a page fault
// that the kernel answers by zeroing the page: packing a pipeline into host blocks took most of
// its load's time on the GPU hosts, the data copy itself a small part. Under the `none` policy that
// host copy was dropped right after the first onload, so a load onto a GPU now packs the tensors
// TorchScript read (memory already touched) straight into the device block; the copy that makes the
// first offload's host copy is Stage's device -> host path.
//
// Note [Staged moves]
// A move first stages the new place (allocates the block and copies into it) without touching
// the component; only Commit rebinds the component's slots, verifies that every tensor is on the
// target and frees the old place. A pipeline stages all its components before committing any,
// so a failure (out of memory on the third component) changes nothing anywhere.
//
// Thread safety: state(), device(), host_bytes(), streaming_bytes() may be read from any thread;
// every other method belongs to the one thread that runs the pipeline's work at a time (its device
// worker).
class ComponentResidency {
 public:
  ComponentResidency(Component& component, ArenaAllocator& arenas, BlockCopier& copier);

  Component& component() { return component_; }
  const Component& component() const { return component_; }
  Residency state() const;
  // The device while kDevice; the CPU otherwise.
  c10::Device device() const;
  // Bytes of the host copy held (0 when there is none).
  uint64_t host_bytes() const;
  bool host_copy_pinned() const { return host_pinned_; }

  // unloaded -> host: packs the component's tensors into a host block, floating weights and
  // buffers converted to `dtype` (quant state keeps its dtype), freeing each original as it goes.
  // With `stream_group_bytes`, also plans and instruments the component for streaming
  // (Note [Streaming]); InvalidArgument when it cannot be streamed.
  Status Place(c10::ScalarType dtype, bool pinned,
               std::optional<uint64_t> stream_group_bytes = std::nullopt);
  // unloaded -> device (a GPU; the meta device in tests): packs the tensors as Place does, but
  // straight into a block on `device`, with no host copy (Note [Loads straight to the GPU]).
  // On an error the component may hold part of its tensors there: Unload it.
  StatusOr<ComponentMove> PlaceOnDevice(c10::ScalarType dtype, const c10::Device& device);

  // A move staged but not committed (Note [Staged moves]); dropping it undoes it.
  struct Staged {
    Staged() = default;
    Staged(Staged&&) = default;
    Staged& operator=(Staged&&) = default;
    // A staged move dropped uncommitted waits for its copy before its block goes back to the
    // allocator (Note [Copy ordering]).
    ~Staged() { copy.Synchronize(); }

    Residency to = Residency::kHost;
    c10::Device device{c10::kCPU};
    std::optional<ArenaBlock> block;       // the new device block (onload/move)
    std::optional<ArenaBlock> host_block;  // a new host copy (first offload)
    PendingCopy copy;
    uint64_t bytes = 0;  // copied
    double seconds = 0;
  };
  // Prepares the move to `to` (host or device `device`). Nothing visible changes.
  // FailedPrecondition for impossible transitions, ResourceExhausted when the target is full.
  StatusOr<Staged> Stage(Residency to, const c10::Device& device);
  // Makes a staged move visible: rebinds the slots, checks every tensor's device (restoring the
  // previous tensors and returning Internal if one is wrong) and frees the old place. When
  // `wait` is false a copy may still be running: Use() makes the compute stream wait for it.
  StatusOr<ComponentMove> Commit(Staged staged, bool wait);
  // Makes the current stream wait for a copy committed without waiting.
  void AwaitPending();
  // Frees the host copy while the component is on a device (Note [The host copy is the master]).
  void DropHostCopy();
  // Drops every tensor: the component holds nothing afterwards.
  void Unload();

  // --- Streaming (Note [Streaming]) ---
  // Whether Place planned the component for streaming.
  bool streamable() const { return plan_.has_value(); }
  const StreamPlan* stream_plan() const { return plan_ ? &*plan_ : nullptr; }
  // host -> streaming(device): its forwards bring their groups to `device`, `prefetch` groups
  // ahead, and keep the first groups that fit in `resident_bytes` until EndStreaming.
  // FailedPrecondition unless streamable and on the host. `warm`: start copying the first groups
  // now.
  Status BeginStreaming(const c10::Device& device, int prefetch, uint64_t resident_bytes,
                        bool warm);
  // streaming -> host: every tensor back on the host copy, every device copy given back.
  StreamStats EndStreaming();
  // Bytes of device copies held by the streamer now (0 when not streaming); any thread.
  uint64_t streaming_bytes() const { return stream_bytes_.load(); }

  // The blocks held now, weakly: after Unload each must be gone (Note [Leak check]).
  using BlockRef = HeldBlock;
  std::vector<BlockRef> Blocks() const;

 private:
  // What Place and PlaceOnDevice pack: the component's tensors and where each goes in a block.
  struct Packing {
    std::vector<torch::Tensor> originals;
    std::optional<ArenaLayout> layout;
    std::optional<StreamPlan> plan;
  };
  StatusOr<Packing> PlanPacking(c10::ScalarType dtype, std::optional<uint64_t> stream_group_bytes);
  // Copies each original into its view of `block` (on `device`), freeing it as it goes, and
  // rebinds the component to the views.
  Status PackInto(Packing& packing, const ArenaBlock& block, const c10::Device& device,
                  c10::ScalarType dtype);
  // How many of the component's tensors there are, all on `device`; or an Internal error naming
  // the first that is not ("... after <after> <device>").
  StatusOr<size_t> CountTensorsOn(const c10::Device& device, const char* after) const;
  // Publishes the state, device and host bytes (of host_) to readers on other threads.
  void SetPlace(Residency state, const c10::Device& device);

  Component& component_;
  ArenaAllocator& arenas_;
  BlockCopier& copier_;
  std::optional<ArenaLayout> layout_;
  c10::ScalarType dtype_ = c10::kFloat;
  std::optional<ArenaBlock> host_;
  std::optional<ArenaBlock> device_block_;
  bool host_pinned_ = false;
  PendingCopy pending_;
  std::optional<StreamPlan> plan_;
  StreamOrder stream_order_;
  std::unique_ptr<ComponentStreamer> streamer_;
  std::atomic<uint64_t> stream_bytes_{0};  // device copies the streamer holds, for any thread
  mutable std::mutex mu_;  // guards state_, device_, host_bytes_ for readers on other threads
  Residency state_ = Residency::kUnloaded;
  c10::Device device_{c10::kCPU};
  uint64_t host_bytes_ = 0;
};

}  // namespace qpool
