#include "component/graph_cache.h"

#include <c10/core/InferenceMode.h>
#if QPOOL_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <ios>
#include <sstream>

#include "util/log.h"

namespace qpool {
namespace {

#if QPOOL_WITH_CUDA
namespace alloc = c10::cuda::CUDACachingAllocator;

// at::cuda::CUDAGraph and the one fact its failure handling needs.
class CapturedGraph : public at::cuda::CUDAGraph {
 public:
  // Whether capture_end got far enough that reset() releases the memory pool.
  bool capture_ended() const { return capture_ended_; }
};

// Bytes of the segments the caching allocator holds for `pool` on `device`.
uint64_t PoolBytes(c10::DeviceIndex device, c10::MempoolId_t pool) {
  uint64_t bytes = 0;
  for (const auto& segment : alloc::snapshot(pool, /*include_traces=*/false).segments) {
    if (segment.device == device && segment.owner_private_pool_id == pool) {
      bytes += segment.total_size;
    }
  }
  return bytes;
}

c10::Device FirstTensorDevice(const std::vector<c10::IValue>& inputs) {
  for (const auto& v : inputs) {
    if (v.isTensor()) return v.toTensor().device();
  }
  return c10::Device(c10::kCPU);
}

// What a replay can hand back: a tensor, or a tuple of tensors (Note [Forward graphs]).
bool IsTensorOrTensors(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined();
  if (!v.isTuple()) return false;
  const auto& elements = v.toTupleRef().elements();
  return !elements.empty() && std::all_of(elements.begin(), elements.end(), [](const auto& e) {
    return e.isTensor() && e.toTensor().defined();
  });
}

// The first line of an error (c10 errors carry a backtrace after it).
std::string FirstLine(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  std::string text = e.what();
  const size_t newline = text.find('\n');
  return newline == std::string::npos ? text : text.substr(0, newline);
}
#endif

}  // namespace

std::optional<std::string> GraphSignature(const std::vector<c10::IValue>& inputs) {
  std::ostringstream out;
  out << std::hexfloat;
  std::optional<c10::Device> device;
  for (const auto& v : inputs) {
    if (v.isTensor()) {
      const torch::Tensor& t = v.toTensor();
      if (!t.defined() || !t.is_cuda() || t.layout() != c10::kStrided ||
          !t.is_non_overlapping_and_dense()) {
        return std::nullopt;
      }
      if (device && *device != t.device()) return std::nullopt;
      device = t.device();
      out << 'T' << t.device() << ' ' << t.scalar_type() << ' ' << t.sizes() << t.strides() << ';';
    } else if (v.isInt()) {
      out << 'i' << v.toInt() << ';';
    } else if (v.isDouble()) {
      out << 'd' << v.toDouble() << ';';
    } else if (v.isBool()) {
      out << 'b' << v.toBool() << ';';
    } else if (v.isNone()) {
      out << "n;";
    } else {
      return std::nullopt;
    }
  }
  if (!device) return std::nullopt;  // nothing on a GPU
  return out.str();
}

#if QPOOL_WITH_CUDA
// One captured graph: its static inputs and output, its memory pool and the stream it ran on.
struct GraphCache::Entry {
  std::string signature;
  c10::Device device{c10::kCUDA, 0};
  std::optional<c10::cuda::CUDAStream> stream;
  c10::MempoolId_t pool{0, 0};
  std::unique_ptr<CapturedGraph> graph;
  std::vector<c10::IValue> inputs;  // what the graph reads: static tensors, scalars as given
  // In the graph's pool, overwritten by every replay: a tensor or a tuple of tensors.
  c10::IValue output;
  uint64_t bytes = 0;
  bool release_pool = false;  // a failed capture left the pool to be released here

  ~Entry() {
    try {
      c10::cuda::CUDAGuard guard(device);
      if (stream) stream->synchronize();  // a replay may still use the pool and the inputs
      output = c10::IValue();
      inputs.clear();
      graph.reset();  // releases the pool once its capture ended
      if (release_pool) alloc::releasePool(device.index(), pool);
      // The pool's segments go back to the driver now rather than at the next empty_cache.
      if (pool.first != 0 || pool.second != 0) alloc::emptyCache(pool);
    } catch (const std::exception& e) {
      log::Error("freeing a CUDA graph on ", device.str(), " failed: ", FirstLine(e));
    }
  }
};
#else
// Without CUDA no graph is ever captured (GraphSignature wants a CUDA tensor).
struct GraphCache::Entry {
  uint64_t bytes = 0;
};
#endif

GraphCache::GraphCache(std::string owner, size_t capacity)
    : owner_(std::move(owner)), capacity_(capacity) {}

GraphCache::~GraphCache() { Clear(); }

GraphStats GraphCache::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  GraphStats s = stats_;
  s.bytes = bytes_.load();
  return s;
}

void GraphCache::set_capacity(size_t capacity) {
  capacity_.store(capacity);
  Trim(capacity);
}

void GraphCache::Clear() { Trim(0); }

void GraphCache::Trim(size_t keep) {
  while (entries_.size() > keep) {
    bytes_ -= entries_.back()->bytes;
    entries_.pop_back();  // frees the graph and its memory
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.graphs = entries_.size();
  }
}

std::optional<c10::IValue> GraphCache::Run(const std::vector<c10::IValue>& inputs,
                                           const ForwardFn& forward) {
  const size_t capacity = capacity_.load();
  if (failed_ || capacity == 0) return std::nullopt;
  std::optional<std::string> signature = GraphSignature(inputs);
  if (!signature) return std::nullopt;
#if QPOOL_WITH_CUDA
  const c10::Device device = FirstTensorDevice(inputs);
  c10::cuda::CUDAGuard guard(device);
  // A capture needs a stream of its own; the default stream's work would be serialized with it.
  if (c10::cuda::getCurrentCUDAStream() == c10::cuda::getDefaultCUDAStream()) return std::nullopt;
  c10::InferenceMode inference;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if ((*it)->signature != *signature) continue;
    entries_.splice(entries_.begin(), entries_, it);
    return Replay(*entries_.front(), inputs);
  }
  if (std::find(warmed_.begin(), warmed_.end(), *signature) == warmed_.end()) {
    warmed_.push_front(*signature);  // this call's eager forward is the warm-up
    if (warmed_.size() > 4 * capacity) warmed_.pop_back();
    return std::nullopt;
  }
  Trim(capacity - 1);  // make room before the capture allocates
  std::unique_ptr<Entry> entry = Capture(*signature, inputs, forward);
  if (!entry) return std::nullopt;
  bytes_ += entry->bytes;
  entries_.push_front(std::move(entry));
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.captures;
    stats_.graphs = entries_.size();
  }
  return Replay(*entries_.front(), inputs);
#else
  (void)forward;
  return std::nullopt;
#endif
}

#if QPOOL_WITH_CUDA
std::optional<c10::IValue> GraphCache::Replay(Entry& entry,
                                              const std::vector<c10::IValue>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].isTensor()) entry.inputs[i].toTensor().copy_(inputs[i].toTensor());
  }
  entry.graph->replay();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.replays;
  }
  if (entry.output.isTensor()) return c10::IValue(entry.output.toTensor().clone());
  std::vector<c10::IValue> copies;
  for (const c10::IValue& v : entry.output.toTupleRef().elements()) {
    copies.emplace_back(v.toTensor().clone());
  }
  return c10::IValue(c10::ivalue::Tuple::create(std::move(copies)));
}

std::unique_ptr<GraphCache::Entry> GraphCache::Capture(const std::string& signature,
                                                       const std::vector<c10::IValue>& inputs,
                                                       const ForwardFn& forward) {
  auto entry = std::make_unique<Entry>();
  entry->signature = signature;
  entry->device = FirstTensorDevice(inputs);
  entry->stream = c10::cuda::getCurrentCUDAStream();
  uint64_t static_bytes = 0;
  for (const auto& v : inputs) {
    if (!v.isTensor()) {
      entry->inputs.push_back(v);
      continue;
    }
    const torch::Tensor& t = v.toTensor();
    torch::Tensor s = at::empty_strided(t.sizes(), t.strides(), t.options());
    s.copy_(t);
    static_bytes += s.storage().nbytes();
    entry->inputs.emplace_back(std::move(s));
  }
  entry->pool = at::cuda::graph_pool_handle();
  entry->graph = std::make_unique<CapturedGraph>();
  std::string error;
  bool began = false;
  try {
    entry->graph->capture_begin(entry->pool, cudaStreamCaptureModeThreadLocal);
    began = true;
    c10::IValue out = forward(entry->inputs);
    entry->graph->capture_end();  // instantiates the graph
    if (IsTensorOrTensors(out)) {
      entry->output = std::move(out);
    } else {
      error = StrCat("the forward returned ", out.tagKind(), ", not a Tensor or a tuple of them");
    }
  } catch (const std::exception& e) {
    error = FirstLine(e);
  }
  if (error.empty()) {
    entry->bytes = PoolBytes(entry->device.index(), entry->pool) + static_bytes;
    return entry;
  }
  // End a capture the forward's error left running, and give the pool back.
  const cudaStream_t stream = entry->stream->stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
  }
  (void)cudaGetLastError();  // the capture's error is reported below, not by the next call
  if (!entry->graph->capture_ended()) {
    try {
      alloc::endAllocateToPool(entry->device.index(), entry->pool);
    } catch (const c10::Error&) {
      // capture_end stopped the pool's allocations, or capture_begin never started them
    }
    try {
      entry->release_pool = alloc::getPoolUseCount(entry->device.index(), entry->pool) > 0;
    } catch (const c10::Error&) {
      entry->release_pool = began;  // capture_begin returned: it created the pool
    }
  }
  entry.reset();
  failed_ = true;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.failures;
  }
  log::Warn("component '", owner_, "': capturing its forward in a CUDA graph failed (", error,
            "); it runs eagerly from now on");
  return nullptr;
}
#endif

}  // namespace qpool
