// GraphCache: CUDA graphs of one component's forward, one per input signature, replayed instead
// of launching the forward's kernels one by one (Note [Forward graphs]).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace qpool {

// What a component's graphs did and hold.
struct GraphStats {
  uint64_t captures = 0;  // graphs captured
  uint64_t replays = 0;   // forwards answered by a replay
  uint64_t failures = 0;  // captures that failed (the cache is off afterwards)
  uint64_t graphs = 0;    // graphs held now
  uint64_t bytes = 0;     // device bytes they hold: their memory pools and static inputs
};

// The signature a graph is captured for: every tensor input's device, dtype, sizes and strides
// and the value of every scalar input. Nullopt when the inputs cannot be replayed: a tensor off
// the GPU, two GPUs, a tensor that is not dense (expanded, overlapping) or an input of another
// kind than tensor, int, double, bool or None.
std::optional<std::string> GraphSignature(const std::vector<c10::IValue>& inputs);

// Note [Forward graphs]
// A denoising loop runs the same forward on inputs of the same shapes at every step; launching
// its kernels one by one from the TorchScript interpreter leaves the GPU waiting on the CPU
// whenever the kernels are short (small batches on a large GPU). Text encoders, whose 77-token
// forwards are all short kernels, run once per request with the same shapes across requests
// (their pipelines enable graphs only while they stay on the device: UseEncoderGraphs in
// pipeline/pipeline.h). The cache records the forward once per input signature as a CUDA graph
// and then launches the whole graph at once:
// - The first forward of a signature runs eagerly: it is the warm-up that makes every lazy
//   initialization (library handles and workspaces, kernel attributes, module loading) happen
//   outside a capture; signatures stay warm when graphs are dropped. The next forward of the
//   signature captures on the caller's current stream (never the default stream; the worker's
//   own is a pool stream) into a private memory pool, with the inputs copied into static
//   buffers; it and every later forward of the signature copy their inputs into those buffers,
//   replay, and return a clone of the static output (a tensor, or a tuple of tensors such as a
//   text encoder's hidden states and pooled embedding), so callers own what they get and a replay
//   never overwrites a result still in use. A forward that returns anything else fails its
//   capture (below).
// - The capture runs in thread-local capture mode: other device workers allocating or
//   synchronizing on their own GPUs meanwhile do not break it.
// - A graph bakes in the addresses of every tensor it reads, weights included, so any change of
//   the component's tensors (Component::Rebind, RebindOne, Refresh: residency moves, offload,
//   unload, streaming) drops every graph first (Clear). Dropping a graph frees its memory pool
//   back to the driver, so an offloaded or unloaded component leaves no graph memory behind.
// - Graph memory is the component's: Component::Bytes() reports it as ComponentBytes::graph,
//   which admission, events and metrics count like any other byte the component holds.
// - At most `capacity` signatures keep a graph, the least recently used dropped first; a
//   component used at many sizes still holds a bounded number of pools.
// - A capture that fails (an op that synchronizes or reads the host, an allocation failure)
//   is ended and its pool freed; the forward runs eagerly and the cache stays off for this
//   component from then on, with one warning in the log.
// Replay equals eager bit for bit: the same kernels run on the same inputs with the same
// strides; only their launches are recorded.
//
// Thread safety: Run, Clear and set_capacity belong to the component's owning worker (the thread
// that runs its forwards and moves it); bytes() and stats() may be read from any thread.
class GraphCache {
 public:
  using ForwardFn = std::function<c10::IValue(std::vector<c10::IValue>)>;

  // `owner` names the component in the log. Capacity 0: off.
  GraphCache(std::string owner, size_t capacity);
  // Frees every graph (Clear).
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The forward's output for `inputs` from the graph of their signature (a tensor or a tuple of
  // tensors, as the forward returned), or nullopt when the caller must run the forward eagerly
  // itself: the cache is off, no CUDA, the default stream, inputs GraphSignature refuses, a
  // signature's first forward (the warm-up), a failed capture. Throws what a replay throws.
  std::optional<c10::IValue> Run(const std::vector<c10::IValue>& inputs, const ForwardFn& forward);
  // Drops every graph and frees its memory (waits for replays still running).
  void Clear();
  // Signatures that keep a graph; lowering it drops the least recently used ones, 0 all.
  void set_capacity(size_t capacity);
  size_t capacity() const { return capacity_.load(); }

  // Device bytes the graphs hold now.
  uint64_t bytes() const { return bytes_.load(); }
  GraphStats stats() const;

 private:
  struct Entry;
  std::optional<c10::IValue> Replay(Entry& entry, const std::vector<c10::IValue>& inputs);
  // Captures a graph for `signature`; null after a failure (logged, the cache turned off).
  std::unique_ptr<Entry> Capture(const std::string& signature,
                                 const std::vector<c10::IValue>& inputs, const ForwardFn& forward);
  // Drops least recently used graphs until at most `keep` remain.
  void Trim(size_t keep);

  const std::string owner_;
  std::atomic<size_t> capacity_;
  std::list<std::unique_ptr<Entry>> entries_;  // most recently used first
  std::list<std::string> warmed_;              // signatures whose warm-up ran, newest first
  bool failed_ = false;
  std::atomic<uint64_t> bytes_{0};
  mutable std::mutex stats_mu_;  // guards stats_
  GraphStats stats_;
};

}  // namespace qpool
