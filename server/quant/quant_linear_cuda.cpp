#include "quant/quant_linear_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>

#include "quant/geglu_linear_op.h"
#include "quant/geglu_op.h"
#include "quant/layer_norm_kernels.h"
#include "quant/norm_linear_op.h"
#include "quant/quant_kernels.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "quant/w8a8_kernels.h"
#include "quant/w8a8_linear.h"

namespace qpool::quant {

cuda::ElemType ElemTypeOf(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return cuda::ElemType::kFloat;
    case at::kHalf:
      return cuda::ElemType::kHalf;
    case at::kBFloat16:
      return cuda::ElemType::kBFloat16;
    default:
      TORCH_CHECK(false, "qpool: unsupported dtype ", t, " for a CUDA kernel");
  }
}

namespace {

// Note [W8A8 product choice]
// Where both int8 products run (Hopper, fp16/bf16 x), the automatic choice takes the
// warpgroup-MMA kernel (Note [Warpgroup-MMA W8A8 linear]) over at::_int_mm + the epilogue
// kernel where it measured faster over the ten benchmark layers
// (bench/results/quant_linear_w8a8_h100.json): on every layer from M = 4096, from M = 1024
// except on SD 1.5's narrow 320 x 320 and 768 x 320 projections, and at M = 154 only on the
// wide feed-forward layers (not on FLUX's 3072 x 3072). Between 17 and 127 rows nothing was
// measured and cuBLASLt stays. kWgmma forces the kernel wherever it runs,
// kIntMatmul cuBLASLt.
bool W8A8WgmmaWins(int64_t m, int64_t k, int64_t n) {
  if (m >= 4096) return true;
  if (m >= 1024) return k * n >= (int64_t{1} << 18);
  return m >= 128 && std::max(k, n) >= 5120 && k * n >= (int64_t{1} << 22);
}

// The int8 rows of a w8a8 product: q [m, k], their maxima, and the row scales the
// warpgroup-MMA kernel reads (undefined where cuBLASLt multiplies); filled by a quantizing pass.
struct W8A8Rows {
  at::Tensor q, row_amax, row_scale;
};

// Allocates the rows of an m x k by k x n product and chooses its kernel: the warpgroup-MMA one
// where Note [W8A8 product choice] takes it and it runs, else at::_int_mm.
W8A8Rows MakeW8A8Rows(int64_t m, int64_t k, int64_t n, const at::Tensor& weight,
                      const at::TensorOptions& opts, cuda::ElemType type, CudaPath path) {
  W8A8Rows rows;
  rows.q = at::empty({m, k}, opts.dtype(at::kChar));
  rows.row_amax = at::empty({m}, opts.dtype(at::kFloat));
  const bool wgmma =
      (path == CudaPath::kWgmma || (path == CudaPath::kAuto && W8A8WgmmaWins(m, k, n))) &&
      cuda::W8A8WgmmaSupported(m, k, n, rows.q.data_ptr(), weight.data_ptr(), type);
  if (wgmma) rows.row_scale = at::empty({m}, opts.dtype(at::kFloat));
  return rows;
}

// The product of quantized rows and the contiguous int8 weight [n, k], scaled and biased:
// out [m, n] of `opts`'s dtype.
at::Tensor W8A8Product(const W8A8Rows& rows, const at::Tensor& weight, const at::Tensor& absmax,
                       const std::optional<at::Tensor>& bias, const at::TensorOptions& opts,
                       cuda::ElemType type, cudaStream_t stream) {
  const int64_t m = rows.q.size(0), k = rows.q.size(1), n = weight.size(0);
  const bool wgmma = rows.row_scale.defined();
  // The kernel widens a bias of x's dtype itself; the epilogue kernel takes float32.
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = (wgmma && bias->scalar_type() == opts.dtype() ? *bias : bias->to(at::kFloat)).contiguous();
  }
  at::Tensor out = at::empty({m, n}, opts);
  if (wgmma) {
    const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t bytes = cuda::W8A8WgmmaWorkspaceBytes(m, k, n, sm_count);
    at::Tensor workspace;
    if (bytes > 0) workspace = at::empty({bytes}, opts.dtype(at::kByte));
    cuda::LaunchW8A8Wgmma(
        rows.q.data_ptr<int8_t>(), rows.row_scale.data_ptr<float>(), weight.data_ptr<int8_t>(),
        absmax.data_ptr<float>(), b.defined() ? b.data_ptr() : nullptr,
        b.defined() ? ElemTypeOf(b.scalar_type()) : cuda::ElemType::kFloat, m, k, n, out.data_ptr(),
        type, sm_count, workspace.defined() ? workspace.data_ptr() : nullptr, stream);
  } else {
    const at::Tensor acc = at::_int_mm(rows.q, weight.t());
    cuda::LaunchW8A8Epilogue(acc.data_ptr<int32_t>(), rows.row_amax.data_ptr<float>(),
                             absmax.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
                             m, n, out.data_ptr(), type, stream);
  }
  return out;
}

// Note [W8A8 linear] on CUDA: where the int8 product runs, x is quantized by the fused kernel
// (Note [Fused W8A8 kernels]) and multiplied, on Hopper by the warpgroup-MMA kernel that scales
// in its epilogue where Note [W8A8 product choice] takes it, otherwise by at::_int_mm and
// scaled by the fused epilogue kernel; the ATen form where the int8 product does not run.
at::Tensor W8A8LinearCuda(const at::Tensor& x, const QuantState& s,
                          const std::optional<at::Tensor>& bias, CudaPath path,
                          const WeightOnlyLinear& fallback) {
  const int64_t k = x.size(-1);
  const int64_t n = s.weight.size(0);
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  if (!W8A8IntMatmulRuns(m, k, n)) return W8A8Linear(x, s, bias, fallback);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cuda::ElemType type = ElemTypeOf(x.scalar_type());
  const at::Tensor smooth = s.code.contiguous();
  const at::Tensor weight = s.weight.contiguous();
  const W8A8Rows rows = MakeW8A8Rows(m, k, n, weight, x.options(), type, path);
  cuda::LaunchW8A8QuantizeRows(
      x2.data_ptr(), type, smooth.data_ptr<float>(), m, k, rows.q.data_ptr<int8_t>(),
      rows.row_amax.data_ptr<float>(),
      rows.row_scale.defined() ? rows.row_scale.data_ptr<float>() : nullptr, stream);
  return W8A8Product(rows, weight, s.absmax.contiguous(), bias, x.options(), type, stream)
      .reshape(QuantLinearOutputShape(x, n));
}

// Contiguous copies of the state (no-ops when already contiguous) and the raw view on them;
// the copies must outlive the launches.
struct PackedWeight {
  QuantState contiguous;
  cuda::PackedWeightView view;
};

PackedWeight MakePacked(const QuantState& s, const QuantLayout& layout) {
  PackedWeight p;
  p.contiguous =
      QuantState{s.weight.contiguous(),        s.absmax.contiguous(),      s.code.contiguous(),
                 s.nested_absmax.contiguous(), s.nested_code.contiguous(), s.offset.contiguous()};
  const QuantState& c = p.contiguous;
  cuda::PackedWeightView& v = p.view;
  v.weight = static_cast<const uint8_t*>(c.weight.data_ptr());
  v.nf4 = layout.format == QuantFormat::kNf4;
  v.double_quant = layout.double_quant;
  v.rows = layout.out_features;
  v.in_features = layout.in_features;
  v.padded_in = layout.padded_in;
  v.row_bytes = layout.row_bytes;
  v.blocksize = layout.blocksize;
  while (v.nf4 && (int64_t{1} << v.block_shift) < v.blocksize) ++v.block_shift;
  if (layout.double_quant) {
    v.absmax_q = c.absmax.data_ptr<uint8_t>();
    v.nested_absmax = c.nested_absmax.data_ptr<float>();
    v.nested_code = c.nested_code.data_ptr<float>();
    v.offset = c.offset.data_ptr<float>();
  } else {
    v.absmax = c.absmax.data_ptr<float>();
  }
  if (v.nf4) v.code = c.code.data_ptr<float>();
  return p;
}

// The current device for the small-M kernel, with a forced block shape if any.
cuda::MmaDevice MmaDeviceOf(cuda::MmaShape shape) {
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  cuda::MmaDevice device;
  device.sm_count = props->multiProcessorCount;
  device.clusters = props->major >= 9;
  device.shape = shape;
  return device;
}

at::Tensor QuantLinearCudaOp(const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& absmax, const at::Tensor& code,
                             const at::Tensor& nested_absmax, const at::Tensor& nested_code,
                             const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  return QuantLinearCuda(x, QuantState{weight, absmax, code, nested_absmax, nested_code, offset},
                         bias, CudaPath::kAuto);
}

}  // namespace

at::Tensor DequantizeCuda(const QuantState& s, int64_t in_features, at::ScalarType dtype) {
  TORCH_CHECK(s.weight.is_cuda(), "DequantizeCuda: weight is on ", s.weight.device());
  c10::cuda::CUDAGuard guard(s.weight.device());
  const QuantLayout layout = InspectQuantState(s, in_features, "DequantizeCuda");
  if (layout.format == QuantFormat::kNone) return s.weight.to(dtype);
  if (layout.format == QuantFormat::kW8A8) return Dequantize(s, in_features, dtype);  // ATen
  PackedWeight packed = MakePacked(s, layout);
  at::Tensor out = at::empty({layout.out_features, in_features}, s.weight.options().dtype(dtype));
  cuda::LaunchDequantize(packed.view, out.data_ptr(), ElemTypeOf(dtype),
                         at::cuda::getCurrentCUDAStream());
  return out;
}

// Note [Kernel path override]: QPOOL_QUANT_CUDA_PATH=auto|fused|mma|dequant|wgmma|intmm replaces
// kAuto for the whole process: an operator's escape hatch when a kernel misbehaves on a new GPU,
// and a way to compare paths end to end. Read once; unknown values are ignored (auto).
static CudaPath PathFromEnvironment() {
  static const CudaPath path = [] {
    const char* env = std::getenv("QPOOL_QUANT_CUDA_PATH");
    const std::string v = env ? env : "";
    if (v == "fused") return CudaPath::kFused;
    if (v == "mma") return CudaPath::kMma;
    if (v == "dequant") return CudaPath::kDequantMatmul;
    if (v == "wgmma") return CudaPath::kWgmma;
    if (v == "intmm") return CudaPath::kIntMatmul;
    return CudaPath::kAuto;
  }();
  return path;
}

// Note [Medium-M path choice]: measured against dequantize + cuBLAS for M in
// {17, 32, 77, 128, 154} on the ten benchmark layers, int8, nf4 and nf4 + double quant
// (bench/results/quant_linear_medium_m_h100.md). The tensor-core kernel (Note [Tensor-core
// medium-M linear]) wins only on large weights: for K * N >= 2^24 at M <= 32 (one group of 32
// rows; the Flux MLP layers) and, for K >= 8192, at 65 <= M <= 80 (one group of 80 rows).
// Smaller layers (below 2^24, e.g. SDXL 1280 x 10240, Flux 3072 x 3072, where it is about even)
// and the other M stay on dequantize + cuBLAS; M in 33..64 with K >= 8192 was not measured and
// stays there too. On Hopper the warpgroup-MMA kernel comes first where WgmmaWins() (on Flux
// 12288 x 3072 at M = 77 it beats both the tensor-core kernel and dequantize + cuBLAS).
bool MediumMmaWins(int64_t m, int64_t in_features, int64_t out_features) {
  if (m <= cuda::kMmaMaxRows || in_features * out_features < (int64_t{1} << 24)) return false;
  return m <= 32 || (in_features >= 8192 && m >= 65 && m <= 80);
}

// Note [Large-M path choice]: measured against dequantize + cuBLAS for M in {77, 154,
// 256, 512, 1024, 4096} on the ten benchmark layers, int8, nf4 and nf4 + double quant
// (bench/results/quant_linear_large_m_h100.md). The warpgroup-MMA kernel (Note [Warpgroup-MMA
// large-M linear]) runs close to the fp16 GEMM's rate on the large layers; it wins where
// dequantizing costs most next to the product and its tiles (or its stream-K shares) fill the
// GPU:
// - wide layers (N >= 8192, K >= 1024: SDXL 1280 x 10240, Flux 3072 x 12288) and deep ones
//   (K >= 8192, N >= 3072: Flux 12288 x 3072) at 65 <= M <= 1024, by most at the smallest M;
//   int8 also at M = 4096, nf4 not there. Above M = 4096, with the banded raster
//   (Note [Tile raster]), dequantize + cuBLAS is ahead or even at 4608 on every layer, and the
//   kernel ahead at 8192 only on the Flux layers: the rule stops at 4096.
// - large square layers (K, N >= 3072: Flux 3072 x 3072): int8 at 256 <= M <= 4096 (below
//   M = 256 it loses); nf4 without double quant at 512 < M <= 1024 (double quant, about even,
//   left out).
// - mid-size layers (K >= 1024, N >= 4096, K * N >= 2^22: SD 1.5 1280 x 5120) at M <= 512:
//   int8 from M = 65, nf4 from M = 129 (about even at 77; double quant, about even, left out;
//   it loses at M = 1024).
// - short, wide layers (K <= 512, N >= 2048: SD 1.5 320 x 2560) at 65 <= M <= 1024, where the
//   dequantize launch dominates.
// - short, narrow layers (K, N <= 512: SD 1.5 320 x 320), int8 and nf4 at 65 <= M <= 4096, as
//   served (quant_linear_bench, automatic path against QPOOL_QUANT_CUDA_PATH=dequant, with an
//   unchanged layer as the control between the two processes); nf4 + double quant, about even,
//   left out.
// The other layers (K > 512 with N <= 1280, or K * N < 2^22) stay on dequantize + cuBLAS, which
// is faster there (the harness's dequantize timings of the layers under 2048 features are
// noisy; bench/quant_linear_bench measures them steadily). Rows of x per tile, the best of
// 64, 128 and 256 in the harness: 64 up to M = 256 on short and wide layers (M = 1024 on short,
// narrow ones, M = 160 on mid-size ones), 128 up to M = 128 on wide and deep layers (M = 512 on
// short and square layers, M = 256 on mid-size ones, M = 4096 on short, narrow ones), else 256.
std::optional<cuda::WgmmaTile> WgmmaWins(int64_t m, int64_t in_features, int64_t out_features,
                                         QuantFormat format, bool double_quant) {
  if (m < 65) return std::nullopt;
  const bool int8 = format == QuantFormat::kInt8;
  // Tiles of 64 rows up to M = limit64, 128 up to limit128, else 256.
  auto tile_for = [m](int64_t limit64, int64_t limit128) {
    cuda::WgmmaTile tile;
    tile.rows = m <= limit64 ? 64 : m <= limit128 ? 128 : 256;
    return tile;
  };
  const bool wide = out_features >= 8192 && in_features >= 1024;
  const bool deep = in_features >= 8192 && out_features >= 3072;
  if (wide || deep) {
    if (m > (int8 ? 4096 : 1024)) return std::nullopt;
    return tile_for(0, 128);
  }
  if (in_features >= 3072 && out_features >= 3072) {
    const bool wins = int8 ? m >= 256 && m <= 4096 : !double_quant && m > 512 && m <= 1024;
    if (!wins) return std::nullopt;
    return tile_for(0, 512);
  }
  if (in_features >= 1024 && out_features >= 4096 &&
      in_features * out_features >= (int64_t{1} << 22)) {
    if ((!int8 && (double_quant || m <= 128)) || m > 512) return std::nullopt;
    return tile_for(160, 256);
  }
  if (in_features <= 512 && out_features >= 2048) {
    if (m > 1024) return std::nullopt;
    return tile_for(256, 512);
  }
  if (in_features <= 512 && out_features <= 512) {
    if ((!int8 && double_quant) || m > 4096) return std::nullopt;
    return tile_for(1024, 4096);
  }
  return std::nullopt;
}

bool WgmmaRuns(const at::Tensor& x, const QuantState& s) {
  c10::cuda::CUDAGuard guard(x.device());
  const QuantLayout layout = CheckQuantLinearArgs(x, s, std::nullopt);
  if (layout.format == QuantFormat::kNone || layout.format == QuantFormat::kW8A8 ||
      !x.is_contiguous()) {
    return false;
  }
  PackedWeight packed = MakePacked(s, layout);
  return cuda::WgmmaLinearSupported(packed.view, x.data_ptr(), x.numel() / layout.in_features,
                                    ElemTypeOf(x.scalar_type()));
}

cuda::MmaPlan MmaPlanFor(const at::Tensor& x, const QuantState& s) {
  c10::cuda::CUDAGuard guard(x.device());
  const QuantLayout layout = CheckQuantLinearArgs(x, s, std::nullopt);
  TORCH_CHECK(layout.format != QuantFormat::kNone && layout.format != QuantFormat::kW8A8,
              "MmaPlanFor: the weight is not quantized weight-only (int8, nf4)");
  PackedWeight packed = MakePacked(s, layout);
  return cuda::PlanMmaLinear(packed.view, x.numel() / layout.in_features,
                             ElemTypeOf(x.scalar_type()), MmaDeviceOf({}));
}

// Note [Capture-safe kernels]
// The denoiser's forward is captured in CUDA graphs (Note [Forward graphs] in
// component/graph_cache.h), with these kernels in it, so every path here must stay capturable:
// launches (and the stream-K flags' cudaMemsetAsync) go to the current stream only; outputs and
// workspaces come from the caching allocator (at::empty), which routes a capture's allocations
// to the graph's pool; nothing synchronizes, reads a device value on the host or copies from
// pageable memory. The one-time, per-device setup (kernel attributes, occupancy, the driver's
// tensor-map entry point, device properties) is host-only and runs in the eager warm-up call
// that precedes every capture. Tensor maps are built on the host per call and passed by value,
// so a graph keeps the addresses it was captured with, as it does for every other kernel.
at::Tensor QuantLinearCuda(const at::Tensor& x, const QuantState& s,
                           const std::optional<at::Tensor>& bias, CudaPath path,
                           cuda::MmaShape mma_shape) {
  if (path == CudaPath::kAuto) path = PathFromEnvironment();
  CheckSameDevice(x, s, bias);
  TORCH_CHECK(x.is_cuda(), "qpool::quant_linear: the CUDA kernel got x on ", x.device());
  c10::cuda::CUDAGuard guard(x.device());
  const QuantLayout layout = CheckQuantLinearArgs(x, s, bias);
  // No rows (a routed expert no token chose: Note [Routed experts] in hidream_experts.py):
  // no kernel takes an empty grid.
  if (x.numel() == 0) return at::empty(QuantLinearOutputShape(x, layout.out_features), x.options());
  if (layout.format == QuantFormat::kW8A8) {
    // Note [W8A8 linear]: the int8 product; the fallback is the int8 path below.
    return W8A8LinearCuda(x, s, bias, path,
                          [path, mma_shape](const at::Tensor& xs, const QuantState& q,
                                            const std::optional<at::Tensor>& b) {
                            return QuantLinearCuda(xs, q, b, path, mma_shape);
                          });
  }
  if (path == CudaPath::kIntMatmul) path = CudaPath::kAuto;  // w8a8 only
  const at::ScalarType dtype = x.scalar_type();
  std::optional<at::Tensor> b;
  if (bias.has_value() && bias->defined()) b = bias->to(dtype).contiguous();
  if (layout.format == QuantFormat::kNone) return at::linear(x, s.weight.to(dtype), b);

  const int64_t k = layout.in_features;
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  const std::vector<int64_t> out_shape = QuantLinearOutputShape(x, layout.out_features);
  // Note [Small-M path choice]: fp16/bf16 x with M <= cuda::kMmaMaxRows goes to the tensor-core
  // kernel, except int8 at M = 1, where the CUDA-core kernel (one warp per feature, no mma
  // padding of the single row) measured faster on every benchmark layer
  // (bench/results/quant_linear_small_m_h100.md); larger M go to the tensor-core kernel only
  // where MediumMmaWins(); other small M that the tensor-core kernel cannot take go to the
  // CUDA-core kernel up to kFusedMaxRows, and the rest to dequantize + cuBLAS. Before all of
  // them, on Hopper, the warpgroup-MMA kernel where WgmmaWins() (Note [Large-M path choice]).
  PackedWeight packed = MakePacked(s, layout);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const cuda::ElemType et = ElemTypeOf(dtype);
  if (path == CudaPath::kAuto || path == CudaPath::kWgmma) {
    std::optional<cuda::WgmmaTile> tile =
        WgmmaWins(m, layout.in_features, layout.out_features, layout.format, layout.double_quant);
    if (path == CudaPath::kWgmma && !tile) {  // forced where the rule would not take it
      tile = cuda::WgmmaTile{};
      tile->rows = m <= 128 ? 128 : 256;
    }
    if (tile && cuda::WgmmaLinearSupported(packed.view, x2.data_ptr(), m, et)) {
      tile->sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
      at::Tensor out = at::empty({m, layout.out_features}, x.options());
      // Freed as the call returns: the caching allocator keeps the block for the next call on
      // this stream (Note [Dequantize workspace]).
      const int64_t bytes = cuda::WgmmaWorkspaceBytes(packed.view, m, *tile);
      const at::Tensor workspace =
          bytes > 0 ? at::empty({bytes}, x.options().dtype(at::kByte)) : at::Tensor();
      cuda::LaunchWgmmaLinear(packed.view, x2.data_ptr(), m, b ? b->data_ptr() : nullptr,
                              out.data_ptr(), et, *tile, bytes > 0 ? workspace.data_ptr() : nullptr,
                              stream);
      return out.reshape(out_shape);
    }
    if (path == CudaPath::kWgmma) path = CudaPath::kAuto;
  }
  const bool mma_ok = cuda::MmaLinearSupported(packed.view, x2.data_ptr(), m, et);
  const bool auto_mma =
      mma_ok && !(layout.format == QuantFormat::kInt8 && m == 1) &&
      (m <= cuda::kMmaMaxRows || MediumMmaWins(m, layout.in_features, layout.out_features));
  if ((mma_ok && path == CudaPath::kMma) || (auto_mma && path == CudaPath::kAuto)) {
    at::Tensor out = at::empty({m, layout.out_features}, x.options());
    cuda::LaunchMmaLinear(packed.view, x2.data_ptr(), m, b ? b->data_ptr() : nullptr,
                          out.data_ptr(), et, MmaDeviceOf(mma_shape), stream);
    return out.reshape(out_shape);
  }
  if (path == CudaPath::kMma) path = CudaPath::kAuto;
  const bool fused = path == CudaPath::kFused || (path == CudaPath::kAuto && m <= kFusedMaxRows);
  // Note [Dequantize workspace]: the dequantized weight is a plain at::empty from the caching
  // allocator, which hands the same block back on the next call on this stream: a reusable
  // workspace without a second pool that memory accounting would have to know about.
  if (fused) {
    TORCH_CHECK(m <= int64_t{65535} * 16, "qpool::quant_linear: fused path limited to ",
                int64_t{65535} * 16, " rows, got ", m);
    at::Tensor out = at::empty({m, layout.out_features}, x.options());
    cuda::LaunchFusedLinear(packed.view, x2.data_ptr(), m, b ? b->data_ptr() : nullptr,
                            out.data_ptr(), ElemTypeOf(dtype), stream);
    return out.reshape(out_shape);
  }
  at::Tensor w = at::empty({layout.out_features, k}, x.options());
  cuda::LaunchDequantize(packed.view, w.data_ptr(), ElemTypeOf(dtype), stream);
  return at::linear(x, w, b);
}

namespace {

// Note [GEGLU linear op] on CUDA: a w8a8 linear whose int8 product runs on 16-bit rows the
// fused kernel takes quantizes the GEGLU's rows while computing them (Note [GEGLU rows]) and
// multiplies them as qpool::quant_linear does; anything else runs the two ops.
at::Tensor GegluQuantLinearCudaOp(const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& absmax, const at::Tensor& code,
                                  const at::Tensor& nested_absmax, const at::Tensor& nested_code,
                                  const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  const QuantState s{weight, absmax, code, nested_absmax, nested_code, offset};
  const QuantLayout layout = CheckGegluQuantLinearArgs(x, s, bias);
  TORCH_CHECK(x.is_cuda(), "qpool::geglu_quant_linear: the CUDA kernel got x on ", x.device());
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t d = layout.in_features, n = layout.out_features;
  const CudaPath path = PathFromEnvironment();
  if (layout.format == QuantFormat::kW8A8 && HasElemType(x.scalar_type())) {
    const at::Tensor x2 = x.reshape({-1, 2 * d}).contiguous();
    const int64_t m = x2.size(0);
    const cuda::ElemType type = ElemTypeOf(x.scalar_type());
    const at::Tensor smooth = code.contiguous();
    if (W8A8IntMatmulRuns(m, d, n) &&
        cuda::W8A8GegluRowsSupported(x2.data_ptr(), 2 * d, d, type, smooth.data_ptr<float>())) {
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
      const at::Tensor w = weight.contiguous();
      const W8A8Rows rows = MakeW8A8Rows(m, d, n, w, x.options(), type, path);
      cuda::LaunchW8A8GegluQuantizeRows(
          x2.data_ptr(), 2 * d, type, smooth.data_ptr<float>(), m, d, rows.q.data_ptr<int8_t>(),
          rows.row_amax.data_ptr<float>(),
          rows.row_scale.defined() ? rows.row_scale.data_ptr<float>() : nullptr, stream);
      return W8A8Product(rows, w, absmax.contiguous(), bias, x.options(), type, stream)
          .reshape(QuantLinearOutputShape(x, n));
    }
  }
  return QuantLinear(Geglu(x), s, bias);  // the arguments are checked above
}

// Note [Norm linear op] on CUDA: a w8a8 linear whose int8 product runs on 16-bit rows that the
// norm's kernel holds takes them quantized from it (Note [Quantized norm rows]) and multiplies
// them as qpool::quant_linear does; `sum` gets the norm's input where a residual is given.
// nullopt, having run nothing, elsewhere: the caller runs the two ops.
std::optional<at::Tensor> NormW8A8Linear(const at::Tensor& x, const at::Tensor* residual,
                                         const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                                         double eps, const QuantState& s, const QuantLayout& layout,
                                         const std::optional<at::Tensor>& bias, at::Tensor* sum) {
  const int64_t d = layout.in_features, n = layout.out_features;
  if (layout.format != QuantFormat::kW8A8 || !HasElemType(x.scalar_type()) || d == 0) {
    return std::nullopt;
  }
  const int64_t m = x.numel() / d;
  if (!W8A8IntMatmulRuns(m, d, n)) return std::nullopt;
  const at::Tensor xc = x.contiguous();
  const at::Tensor rc = residual ? residual->contiguous() : at::Tensor();
  const at::Tensor nw = norm_weight.contiguous(), nb = norm_bias.contiguous();
  const at::Tensor smooth = s.code.contiguous();
  const cuda::ElemType type = ElemTypeOf(x.scalar_type());
  cuda::LayerNormArgs args;
  args.x = xc.data_ptr();
  args.residual = residual ? rc.data_ptr() : nullptr;
  args.weight = nw.data_ptr();
  args.bias = nb.data_ptr();
  args.smooth = smooth.data_ptr<float>();
  args.rows = m;
  args.d = d;
  args.eps = static_cast<float>(eps);
  args.type = type;
  if (!cuda::LayerNormQuantizeSupported(args)) return std::nullopt;
  const at::Tensor w = s.weight.contiguous();
  const W8A8Rows rows = MakeW8A8Rows(m, d, n, w, x.options(), type, PathFromEnvironment());
  if (residual) {
    *sum = at::empty(x.sizes(), x.options());
    args.sum = sum->data_ptr();
  }
  args.q = rows.q.data_ptr<int8_t>();
  args.row_amax = rows.row_amax.data_ptr<float>();
  args.row_scale = rows.row_scale.defined() ? rows.row_scale.data_ptr<float>() : nullptr;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_CHECK(cuda::LaunchLayerNorm(args, stream), "qpool: the norm's kernel declined its rows");
  return W8A8Product(rows, w, s.absmax.contiguous(), bias, x.options(), type, stream)
      .reshape(QuantLinearOutputShape(x, n));
}

// Checks the arguments, then the quantized rows where they run, else the two ops.
std::tuple<at::Tensor, at::Tensor> NormQuantLinearCuda(const char* op, const at::Tensor& x,
                                                       const at::Tensor* residual,
                                                       const at::Tensor& norm_weight,
                                                       const at::Tensor& norm_bias, double eps,
                                                       const QuantState& s,
                                                       const std::optional<at::Tensor>& bias) {
  const QuantLayout layout =
      CheckNormQuantLinearArgs(op, x, residual, norm_weight, norm_bias, eps, s, bias);
  TORCH_CHECK(x.is_cuda(), op, ": the CUDA kernel got x on ", x.device());
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor sum;
  if (auto out = NormW8A8Linear(x, residual, norm_weight, norm_bias, eps, s, layout, bias, &sum)) {
    return {sum, *out};
  }
  return NormThenQuantLinear(x, residual, norm_weight, norm_bias, eps, s, bias);
}

at::Tensor LayerNormQuantLinearCudaOp(const at::Tensor& x, const at::Tensor& norm_weight,
                                      const at::Tensor& norm_bias, double eps,
                                      const at::Tensor& weight, const at::Tensor& absmax,
                                      const at::Tensor& code, const at::Tensor& nested_absmax,
                                      const at::Tensor& nested_code, const at::Tensor& offset,
                                      const std::optional<at::Tensor>& bias) {
  return std::get<1>(NormQuantLinearCuda(
      "qpool::layer_norm_quant_linear", x, nullptr, norm_weight, norm_bias, eps,
      QuantState{weight, absmax, code, nested_absmax, nested_code, offset}, bias));
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormQuantLinearCudaOp(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& norm_weight,
    const at::Tensor& norm_bias, double eps, const at::Tensor& weight, const at::Tensor& absmax,
    const at::Tensor& code, const at::Tensor& nested_absmax, const at::Tensor& nested_code,
    const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  return NormQuantLinearCuda(
      "qpool::add_layer_norm_quant_linear", x, &residual, norm_weight, norm_bias, eps,
      QuantState{weight, absmax, code, nested_absmax, nested_code, offset}, bias);
}

}  // namespace

}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) {
  m.impl("quant_linear", &qpool::quant::QuantLinearCudaOp);
  m.impl("geglu_quant_linear", &qpool::quant::GegluQuantLinearCudaOp);
  m.impl("layer_norm_quant_linear", &qpool::quant::LayerNormQuantLinearCudaOp);
  m.impl("add_layer_norm_quant_linear", &qpool::quant::AddLayerNormQuantLinearCudaOp);
}
