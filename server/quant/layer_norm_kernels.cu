#include <c10/cuda/CUDAException.h>

#include "quant/layer_norm_kernels.h"
#include "quant/quant_kernel_common.cuh"
#include "quant/w8a8_rows.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;
constexpr int kRowsPerBlock = kThreads / kWarp;
constexpr int kMaxPacksPerLane = 8;  // rows of up to 8 * 32 packs of 16 bytes
// The quantizing kernels are held to 64 registers a thread, as the quantizing pass is (Note [Held
// rows] in w8a8_kernels.cu): unbounded, rows of 1280 values took more and ran slower
// (bench/results/README.md, "W8A8: the norms quantize their linears' rows").
constexpr int kQuantizeBlocksPerSm = 4;

// Where a quantizing kernel writes its rows (LayerNormArgs's q, row_amax, row_scale, smooth).
struct RowsOut {
  const float* smooth;
  int8_t* q;
  float* row_amax;
  float* row_scale;
};

__device__ __forceinline__ float WarpSum(float v) {
  for (int mask = kWarp / 2; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

// Note [Quantized norm rows]
// In a UNet transformer block each LayerNorm's output is read by one w8a8 linear alone (the fused
// self-attention projection, the cross-attention's query, the feed-forward's projection), whose
// first pass reads the normed rows back to quantize them (Note [Fused W8A8 kernels] in
// w8a8_kernels.cu). With q given, the warp that norms a row quantizes it from its registers:
// each normed value rounded to the dtype (the value the norm would have stored), divided by the
// linear's scale (Note [Unit scales] in w8a8_kernels.cu), the row's maximum over the warp, then
// the int8 values (Note [Division by the row's reciprocal]). The same operations in the same
// order as the two passes, so the same bytes (GPU test); the normed rows are never stored and one
// pass is saved.

// One warp per row (Note [Residual layer norm]): lane l holds the row's 16-byte packs l, l + 32,
// ... (at most kPacks of them) in registers, as the dtype's values of the rounded sum. kQuantize
// writes the quantized rows instead of `out` (Note [Quantized norm rows]; 16-bit T, whose packs
// are the chunks of eight values the quantizing kernels divide by smooth).
template <typename T, int kPacks, bool kResidual, bool kQuantize>
__global__ void __launch_bounds__(kThreads, kQuantize ? kQuantizeBlocksPerSm : 1)
    LayerNormKernel(const T* __restrict__ x, const T* __restrict__ residual,
                    const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ sum,
                    T* __restrict__ out, int64_t rows, int d, float eps, RowsOut quantized) {
  constexpr int kValues = 16 / sizeof(T);
  using P = Pack<T, kValues, 16>;
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // a whole warp leaves together
  const int packs = d / kValues;
  const int64_t offset = row * d;
  P v[kPacks];
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarp;
    if (p >= packs) continue;
    const int64_t at = offset + static_cast<int64_t>(p) * kValues;
    v[k] = *reinterpret_cast<const P*>(x + at);
    if constexpr (kResidual) {
      const P r = *reinterpret_cast<const P*>(residual + at);
#pragma unroll
      for (int j = 0; j < kValues; ++j)
        v[k].v[j] = FromFloat<T>(ToFloat(v[k].v[j]) + ToFloat(r.v[j]));
      *reinterpret_cast<P*>(sum + at) = v[k];
    }
#pragma unroll
    for (int j = 0; j < kValues; ++j) total += ToFloat(v[k].v[j]);
  }
  const float mean = WarpSum(total) / static_cast<float>(d);
  float squares = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (lane + k * kWarp >= packs) continue;
#pragma unroll
    for (int j = 0; j < kValues; ++j) {
      const float centred = ToFloat(v[k].v[j]) - mean;
      squares += centred * centred;
    }
  }
  const float rstd = rsqrtf(WarpSum(squares) / static_cast<float>(d) + eps);
  float xs[kQuantize ? kPacks : 1][8];
  float mx = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = lane + k * kWarp;
    if (p >= packs) continue;
    const P w = reinterpret_cast<const P*>(weight)[p];
    const P b = reinterpret_cast<const P*>(bias)[p];
    P o;
#pragma unroll
    for (int j = 0; j < kValues; ++j) {
      o.v[j] =
          FromFloat<T>(ToFloat(w.v[j]) * (rstd * (ToFloat(v[k].v[j]) - mean)) + ToFloat(b.v[j]));
    }
    if constexpr (kQuantize) {
      static_assert(kValues == 8, "quantized rows are 16-bit");
#pragma unroll
      for (int j = 0; j < 8; ++j) xs[k][j] = ToFloat(o.v[j]);
      DivideBySmooth8(quantized.smooth, static_cast<int64_t>(p) * 8, xs[k]);
#pragma unroll
      for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fabsf(xs[k][j]));
    } else {
      *reinterpret_cast<P*>(out + offset + static_cast<int64_t>(p) * kValues) = o;
    }
  }
  if constexpr (kQuantize) {
    for (int mask = kWarp / 2; mask > 0; mask /= 2) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, mask));
    }
    if (lane == 0) StoreRowMax(mx, row, quantized.row_amax, quantized.row_scale);
    const RowDivisor div = DivisorOf(mx);
    int8_t* qr = quantized.q + offset;
    WithDivision(div, [&](auto by_reciprocal) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int p = lane + k * kWarp;
        if (p >= packs) continue;
        *reinterpret_cast<uint2*>(qr + static_cast<int64_t>(p) * 8) =
            div.Quantize8<decltype(by_reciprocal)::value>(xs[k]);
      }
    });
  }
}

template <typename T, int kPacks, bool kResidual>
void LaunchPacks(const LayerNormArgs& a, unsigned blocks, cudaStream_t stream) {
  const auto* x = static_cast<const T*>(a.x);
  const auto* residual = static_cast<const T*>(a.residual);
  const auto* weight = static_cast<const T*>(a.weight);
  const auto* bias = static_cast<const T*>(a.bias);
  auto* sum = static_cast<T*>(a.sum);
  auto* out = static_cast<T*>(a.out);
  const int d = static_cast<int>(a.d);
  const RowsOut quantized{a.smooth, a.q, a.row_amax, a.row_scale};
  if constexpr (sizeof(T) == 2) {
    if (a.q != nullptr) {
      LayerNormKernel<T, kPacks, kResidual, true><<<blocks, kThreads, 0, stream>>>(
          x, residual, weight, bias, sum, out, a.rows, d, a.eps, quantized);
      return;
    }
  }
  LayerNormKernel<T, kPacks, kResidual, false><<<blocks, kThreads, 0, stream>>>(
      x, residual, weight, bias, sum, out, a.rows, d, a.eps, quantized);
}

template <typename T, int kPacks>
void LaunchPacks(const LayerNormArgs& a, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((a.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (a.residual != nullptr) {
    LaunchPacks<T, kPacks, true>(a, blocks, stream);
  } else {
    LaunchPacks<T, kPacks, false>(a, blocks, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The kernel whose lanes hold exactly the packs of a row they need (registers, and so the warps a
// multiprocessor keeps resident, follow the row's width).
template <typename T, int kPacks = 1>
void LaunchFitting(const LayerNormArgs& a, int64_t per_lane, cudaStream_t stream) {
  if constexpr (kPacks < kMaxPacksPerLane) {
    if (per_lane > kPacks) return LaunchFitting<T, kPacks + 1>(a, per_lane, stream);
  }
  LaunchPacks<T, kPacks>(a, stream);
}

// The packs of 16 bytes each lane holds, or 0 where the kernel does not take the inputs.
int64_t PacksPerLane(const LayerNormArgs& a, int64_t values_per_pack) {
  const bool aligned = Aligned16(a.x) && Aligned16(a.weight) && Aligned16(a.bias) &&
                       (a.residual == nullptr || Aligned16(a.residual));
  if (a.d == 0 || a.d % values_per_pack != 0 || !aligned) return 0;
  const int64_t per_lane = (a.d / values_per_pack + kWarp - 1) / kWarp;
  return per_lane > kMaxPacksPerLane ? 0 : per_lane;
}

template <typename T>
bool Launch(const LayerNormArgs& a, cudaStream_t stream) {
  constexpr int64_t kValues = 16 / sizeof(T);
  const int64_t per_lane = PacksPerLane(a, kValues);
  const bool quantize = a.q != nullptr;
  const bool sum_aligned = a.residual == nullptr || Aligned16(a.sum);
  TORCH_CHECK(!quantize || (LayerNormQuantizeSupported(a) && sum_aligned && Aligned16(a.q)),
              "qpool::layer_norm: rows of ", a.d, " values cannot be quantized in the norm's pass");
  if (per_lane == 0 || !sum_aligned || !(quantize || Aligned16(a.out))) return false;
  if (a.rows == 0) return true;
  TORCH_CHECK((a.rows + kRowsPerBlock - 1) / kRowsPerBlock <= int64_t{INT32_MAX},
              "qpool::layer_norm: ", a.rows, " rows");
  LaunchFitting<T>(a, per_lane, stream);
  return true;
}

}  // namespace

bool LayerNormQuantizeSupported(const LayerNormArgs& args) {
  return args.type != ElemType::kFloat && Aligned16(args.smooth) && PacksPerLane(args, 8) > 0;
}

bool LaunchLayerNorm(const LayerNormArgs& args, cudaStream_t stream) {
  bool launched = false;
  WithElemType(args.type, [&](auto zero) { launched = Launch<decltype(zero)>(args, stream); });
  return launched;
}

}  // namespace qpool::quant::cuda
