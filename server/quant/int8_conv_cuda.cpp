// Int8Conv2d through cuDNN's backend graph API (Note [Int8 convolutions]).
#include "quant/int8_conv_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qpool::quant::cuda {
namespace {

// Engine configurations timed at a shape's first call outside capture.
constexpr int64_t kTunedConfigs = 8;
constexpr int kTimedRuns = 3;

void Check(cudnnStatus_t status, const char* what) {
  TORCH_CHECK(status == CUDNN_STATUS_SUCCESS, "Int8Conv2d: cuDNN ", what,
              " failed: ", cudnnGetErrorString(status));
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    Check(cudnnBackendCreateDescriptor(type, &d_), "creating a descriptor");
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { cudnnBackendDestroyDescriptor(d_); }

  cudnnBackendDescriptor_t get() const { return d_; }

  template <typename T>
  Descriptor& Set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  const T* values, int64_t count = 1) {
    Check(cudnnBackendSetAttribute(d_, name, type, count, values), "setting an attribute");
    return *this;
  }
  Descriptor& Set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    cudnnBackendDescriptor_t raw = value.d_;
    return Set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw);
  }
  cudnnStatus_t Finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using Owned = std::unique_ptr<Descriptor>;

// The graph's tensors, by unique id.
enum Uid : int64_t { kX = 1, kW, kScale, kBias, kY, kAcc, kScaled };

struct Key {
  int device;
  int64_t n, c, h, w, k, r, s, stride, padding;
  at::ScalarType out;
  bool bias;
  bool operator==(const Key& o) const {
    return std::tie(device, n, c, h, w, k, r, s, stride, padding, out, bias) ==
           std::tie(o.device, o.n, o.c, o.h, o.w, o.k, o.r, o.s, o.stride, o.padding, o.out,
                    o.bias);
  }
};
struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = std::hash<int>()(key.device);
    for (int64_t v : {key.n, key.c, key.h, key.w, key.k, key.r, key.s, key.stride, key.padding,
                      static_cast<int64_t>(key.out), static_cast<int64_t>(key.bias)}) {
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    }
    return h;
  }
};

// An operation graph and the execution plans built from it. The descriptors the plans were made
// from stay alive with them; parts, candidates and workspaces do not change once the plan is in
// the cache.
struct Plan {
  std::vector<Owned> parts;
  std::vector<Owned> candidates;  // finalized plans, heuristics' order
  std::vector<int64_t> workspaces;
  int64_t chosen = 0;  // guarded by cache_mutex
  bool tuned = false;  // guarded by cache_mutex
};

std::mutex cache_mutex;
std::unordered_map<Key, std::shared_ptr<Plan>, KeyHash> cache;  // guarded by cache_mutex

Descriptor& Keep(Plan& plan, cudnnBackendDescriptorType_t type) {
  plan.parts.push_back(std::make_unique<Descriptor>(type));
  return *plan.parts.back();
}

std::array<int64_t, 4> NhwcStrides(int64_t c, int64_t h, int64_t w) {
  return {h * w * c, 1, w * c, c};
}

Descriptor& TensorDesc(Plan& plan, Uid uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                       std::array<int64_t, 4> strides, bool is_virtual) {
  const int64_t id = uid, alignment = 16;
  Descriptor& t = Keep(plan, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.Set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
      .Set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4)
      .Set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4)
      .Set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &id)
      .Set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment)
      .Set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
  Check(t.Finalize(), "finalizing a tensor");
  return t;
}

// y = x (mode) b, computed in float32.
Descriptor& Pointwise(Plan& plan, cudnnPointwiseMode_t mode, const Descriptor& x,
                      const Descriptor& b, const Descriptor& y) {
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  Descriptor& pw = Keep(plan, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.Set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
      .Set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision);
  Check(pw.Finalize(), "finalizing a pointwise descriptor");
  Descriptor& op = Keep(plan, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.Set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
      .Set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
      .Set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b)
      .Set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  Check(op.Finalize(), "finalizing a pointwise operation");
  return op;
}

// The operation graph of Note [Int8 convolutions] for `key`.
Descriptor& BuildGraph(Plan& plan, const Key& key, cudnnHandle_t handle) {
  const int64_t ho = (key.h + 2 * key.padding - key.r) / key.stride + 1;
  const int64_t wo = (key.w + 2 * key.padding - key.s) / key.stride + 1;
  const std::array<int64_t, 4> out_dims{key.n, key.k, ho, wo};
  const auto out_strides = NhwcStrides(key.k, ho, wo);
  const std::array<int64_t, 4> channel_dims{1, key.k, 1, 1}, channel_strides{key.k, 1, 1, 1};
  Descriptor& x = TensorDesc(plan, kX, CUDNN_DATA_INT8, {key.n, key.c, key.h, key.w},
                             NhwcStrides(key.c, key.h, key.w), false);
  Descriptor& w = TensorDesc(plan, kW, CUDNN_DATA_INT8, {key.k, key.c, key.r, key.s},
                             NhwcStrides(key.c, key.r, key.s), false);
  Descriptor& acc = TensorDesc(plan, kAcc, CUDNN_DATA_FLOAT, out_dims, out_strides, true);
  Descriptor& scale =
      TensorDesc(plan, kScale, CUDNN_DATA_FLOAT, channel_dims, channel_strides, false);
  const cudnnDataType_t out_type = key.out == at::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  Descriptor& y = TensorDesc(plan, kY, out_type, out_dims, out_strides, false);

  const cudnnDataType_t compute = CUDNN_DATA_INT32;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const std::array<int64_t, 2> ones{1, 1}, strides{key.stride, key.stride},
      pads{key.padding, key.padding};
  Descriptor& conv = Keep(plan, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  conv.Set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
      .Set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode)
      .Set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial)
      .Set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, ones.data(), 2)
      .Set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, strides.data(), 2)
      .Set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pads.data(), 2)
      .Set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pads.data(), 2);
  Check(conv.Finalize(), "finalizing the convolution descriptor");
  const float alpha = 1, beta = 0;
  Descriptor& forward = Keep(plan, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  forward.Set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x)
      .Set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w)
      .Set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, acc)
      .Set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv)
      .Set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, &alpha)
      .Set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, &beta);
  Check(forward.Finalize(), "finalizing the convolution");

  std::vector<cudnnBackendDescriptor_t> ops{forward.get()};
  if (key.bias) {
    Descriptor& scaled = TensorDesc(plan, kScaled, CUDNN_DATA_FLOAT, out_dims, out_strides, true);
    Descriptor& bias =
        TensorDesc(plan, kBias, CUDNN_DATA_FLOAT, channel_dims, channel_strides, false);
    ops.push_back(Pointwise(plan, CUDNN_POINTWISE_MUL, acc, scale, scaled).get());
    ops.push_back(Pointwise(plan, CUDNN_POINTWISE_ADD, scaled, bias, y).get());
  } else {
    ops.push_back(Pointwise(plan, CUDNN_POINTWISE_MUL, acc, scale, y).get());
  }
  Descriptor& graph = Keep(plan, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.Set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(),
            static_cast<int64_t>(ops.size()));
  graph.Set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  Check(graph.Finalize(), "finalizing the operation graph");
  return graph;
}

// Finalizes the plans of the engine configurations heuristics `mode` ranks first (at most
// kTunedConfigs); configurations that do not build on this device are skipped.
void AddCandidates(Plan& plan, const Descriptor& graph, cudnnBackendHeurMode_t mode,
                   cudnnHandle_t handle) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.Set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .Set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  if (heuristics.Finalize() != CUDNN_STATUS_SUCCESS) return;
  int64_t count = 0;
  Check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        "counting engine configurations");
  count = std::min(count, kTunedConfigs);
  std::vector<Owned> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  Check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()),
        "reading engine configurations");
  for (int64_t i = 0; i < count; ++i) {
    auto candidate = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    candidate->Set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[i])
        .Set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    if (candidate->Finalize() != CUDNN_STATUS_SUCCESS) continue;
    int64_t workspace = 0, got = 0;
    Check(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                   CUDNN_TYPE_INT64, 1, &got, &workspace),
          "reading a plan's workspace size");
    plan.candidates.push_back(std::move(candidate));
    plan.workspaces.push_back(workspace);
  }
  for (Owned& config : configs) plan.parts.push_back(std::move(config));
}

std::shared_ptr<Plan> BuildPlan(const Key& key, cudnnHandle_t handle) {
  auto plan = std::make_shared<Plan>();
  const Descriptor& graph = BuildGraph(*plan, key, handle);
  AddCandidates(*plan, graph, CUDNN_HEUR_MODE_A, handle);
  if (plan->candidates.empty()) AddCandidates(*plan, graph, CUDNN_HEUR_MODE_FALLBACK, handle);
  TORCH_CHECK(!plan->candidates.empty(), "Int8Conv2d: cuDNN has no engine for an int8 ", key.r, "x",
              key.s, " convolution of ", key.c, " to ", key.k, " channels on ", key.h, "x", key.w,
              " pixels (stride ", key.stride, ", padding ", key.padding, ")");
  return plan;
}

// The tensors of one call, in the graph's unique ids.
struct Pack {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
};

void Execute(const Plan& plan, int64_t candidate, const Pack& pack, cudnnHandle_t handle,
             const at::TensorOptions& device) {
  const at::Tensor workspace =
      at::empty({std::max<int64_t>(plan.workspaces[candidate], 1)}, device.dtype(at::kByte));
  void* workspace_ptr = workspace.data_ptr();
  Descriptor variants(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  variants
      .Set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, pack.uids.data(),
           static_cast<int64_t>(pack.uids.size()))
      .Set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pack.pointers.data(),
           static_cast<int64_t>(pack.pointers.size()))
      .Set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace_ptr);
  Check(variants.Finalize(), "finalizing the variant pack");
  Check(cudnnBackendExecute(handle, plan.candidates[candidate]->get(), variants.get()),
        "executing the convolution");
}

// The fastest candidate on these tensors: each runs once, then kTimedRuns times between events.
int64_t Tune(const Plan& plan, const Pack& pack, cudnnHandle_t handle,
             const at::TensorOptions& device) {
  int64_t best = 0;
  float best_ms = std::numeric_limits<float>::max();
  for (int64_t i = 0; i < static_cast<int64_t>(plan.candidates.size()); ++i) {
    Execute(plan, i, pack, handle, device);
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record(at::cuda::getCurrentCUDAStream());
    for (int run = 0; run < kTimedRuns; ++run) Execute(plan, i, pack, handle, device);
    stop.record(at::cuda::getCurrentCUDAStream());
    stop.synchronize();
    const float ms = start.elapsed_time(stop);
    if (ms < best_ms) best = i, best_ms = ms;
  }
  return best;
}

bool Capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(), &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

void CheckArgs(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
               const at::Tensor& weight_scale, const at::Tensor& bias, int64_t stride,
               int64_t padding, at::ScalarType out_dtype) {
  TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "Int8Conv2d: x and weight must be 4-D, got ",
              x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == at::kChar && weight.scalar_type() == at::kChar,
              "Int8Conv2d: x and weight must be int8, got ", x.scalar_type(), " and ",
              weight.scalar_type());
  TORCH_CHECK(x.is_cuda() && weight.device() == x.device() && x_scale.device() == x.device() &&
                  weight_scale.device() == x.device() &&
                  (!bias.defined() || bias.device() == x.device()),
              "Int8Conv2d: every tensor must be on x's CUDA device (", x.device(), ")");
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                  weight.is_contiguous(at::MemoryFormat::ChannelsLast),
              "Int8Conv2d: x and weight must be channels-last contiguous");
  const int64_t c = x.size(1), k = weight.size(0);
  TORCH_CHECK(weight.size(1) == c, "Int8Conv2d: weight has ", weight.size(1),
              " input channels, x has ", c);
  TORCH_CHECK(c % 16 == 0 && k % 16 == 0, "Int8Conv2d: channels must be multiples of 16, got ", c,
              " in and ", k, " out");
  const auto is_vector = [](const at::Tensor& t, int64_t n) {
    return t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == n && t.is_contiguous();
  };
  TORCH_CHECK(is_vector(x_scale, 1), "Int8Conv2d: x_scale must be float32 [1], got ",
              x_scale.scalar_type(), " ", x_scale.sizes());
  TORCH_CHECK(is_vector(weight_scale, k), "Int8Conv2d: weight_scale must be float32 [", k,
              "], got ", weight_scale.scalar_type(), " ", weight_scale.sizes());
  TORCH_CHECK(!bias.defined() || is_vector(bias, k), "Int8Conv2d: bias must be float32 [", k,
              "], got ", bias.defined() ? bias.sizes() : at::IntArrayRef{});
  TORCH_CHECK(stride >= 1 && padding >= 0, "Int8Conv2d: stride must be >= 1 and padding >= 0, ",
              "got ", stride, " and ", padding);
  TORCH_CHECK(
      x.size(2) + 2 * padding >= weight.size(2) && x.size(3) + 2 * padding >= weight.size(3),
      "Int8Conv2d: the ", weight.size(2), "x", weight.size(3), " kernel is larger than ",
      "the padded ", x.size(2), "x", x.size(3), " input");
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16,
              "Int8Conv2d: the output dtype must be float16 or bfloat16, got ", out_dtype);
}

}  // namespace

bool Int8ConvSupported(const at::Tensor& x, const at::Tensor& weight, at::ScalarType out_dtype) {
  if (!x.is_cuda() || x.dim() != 4 || weight.dim() != 4 || x.scalar_type() != at::kChar ||
      weight.scalar_type() != at::kChar || x.size(1) != weight.size(1) || x.size(1) % 16 != 0 ||
      weight.size(0) % 16 != 0 || (out_dtype != at::kHalf && out_dtype != at::kBFloat16)) {
    return false;
  }
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(x.device().index());
  return prop->major >= 8;
}

at::Tensor Int8Conv2d(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                      const at::Tensor& weight_scale, const at::Tensor& bias, int64_t stride,
                      int64_t padding, at::ScalarType out_dtype) {
  CheckArgs(x, x_scale, weight, weight_scale, bias, stride, padding, out_dtype);
  const c10::cuda::CUDAGuard guard(x.device());
  const Key key{x.device().index(), x.size(0),      x.size(1),      x.size(2), x.size(3),
                weight.size(0),     weight.size(2), weight.size(3), stride,    padding,
                out_dtype,          bias.defined()};
  const int64_t ho = (key.h + 2 * padding - key.r) / stride + 1;
  const int64_t wo = (key.w + 2 * padding - key.s) / stride + 1;
  const at::Tensor y =
      at::empty({key.n, key.k, ho, wo},
                x.options().dtype(out_dtype).memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;  // an empty batch: nothing for cuDNN to do
  // The batch's one activation scale goes into the weight scales here: cuDNN's fused engines
  // take per-channel factors, not per-image ones (Note [Int8 convolutions]).
  const at::Tensor scale = weight_scale * x_scale;
  Pack pack{{kX, kW, kScale, kY},
            {x.data_ptr(), weight.data_ptr(), scale.data_ptr(), y.data_ptr()}};
  if (bias.defined()) {
    pack.uids.push_back(kBias);
    pack.pointers.push_back(bias.data_ptr());
  }
  for (const void* p : pack.pointers) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
                "Int8Conv2d: every tensor must start at a 16-byte boundary");
  }

  const cudnnHandle_t handle = at::native::getCudnnHandle();
  Check(cudnnSetStream(handle, at::cuda::getCurrentCUDAStream()), "setting the stream");
  std::shared_ptr<Plan> plan;
  int64_t chosen = 0;
  bool tuned = false;
  const auto lookup = [&](std::shared_ptr<Plan> built) {
    const std::lock_guard<std::mutex> lock(cache_mutex);
    auto found = cache.find(key);
    if (found == cache.end() && built != nullptr) found = cache.emplace(key, built).first;
    if (found == cache.end()) return;
    plan = found->second;
    chosen = plan->chosen;
    tuned = plan->tuned;
  };
  lookup(nullptr);
  if (plan == nullptr) lookup(BuildPlan(key, handle));
  if (!tuned && !Capturing()) {
    chosen = Tune(*plan, pack, handle, x.options());
    const std::lock_guard<std::mutex> lock(cache_mutex);
    plan->chosen = chosen;
    plan->tuned = true;
  }
  Execute(*plan, chosen, pack, handle, x.options());
  return y;
}

int64_t Int8ConvCachedPlans() {
  const std::lock_guard<std::mutex> lock(cache_mutex);
  return static_cast<int64_t>(cache.size());
}

}  // namespace qpool::quant::cuda
