#include <c10/cuda/CUDAException.h>

#include "quant/layer_norm_kernels.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;
constexpr int kRowsPerBlock = kThreads / kWarp;
constexpr int kMaxPacksPerLane = 8;  // rows of up to 8 * 32 packs of 16 bytes

__device__ __forceinline__ float WarpSum(float v) {
  for (int mask = kWarp / 2; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

// One warp per row (Note [Residual layer norm]): lane l holds the row's 16-byte packs l, l + 32,
// ... (at most kPacks of them) in registers, as the dtype's values of the rounded sum.
template <typename T, int kPacks, bool kResidual>
__global__ void LayerNormKernel(const T* __restrict__ x, const T* __restrict__ residual,
                                const T* __restrict__ weight, const T* __restrict__ bias,
                                T* __restrict__ sum, T* __restrict__ out, int64_t rows, int d,
                                float eps) {
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
    *reinterpret_cast<P*>(out + offset + static_cast<int64_t>(p) * kValues) = o;
  }
}

template <typename T, int kPacks>
void LaunchPacks(const LayerNormArgs& a, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((a.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const auto* x = static_cast<const T*>(a.x);
  const auto* residual = static_cast<const T*>(a.residual);
  const auto* weight = static_cast<const T*>(a.weight);
  const auto* bias = static_cast<const T*>(a.bias);
  auto* sum = static_cast<T*>(a.sum);
  auto* out = static_cast<T*>(a.out);
  const int d = static_cast<int>(a.d);
  if (residual != nullptr) {
    LayerNormKernel<T, kPacks, true>
        <<<blocks, kThreads, 0, stream>>>(x, residual, weight, bias, sum, out, a.rows, d, a.eps);
  } else {
    LayerNormKernel<T, kPacks, false>
        <<<blocks, kThreads, 0, stream>>>(x, residual, weight, bias, sum, out, a.rows, d, a.eps);
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

template <typename T>
bool Launch(const LayerNormArgs& a, cudaStream_t stream) {
  constexpr int64_t kValues = 16 / sizeof(T);
  const bool aligned = Aligned16(a.x) && Aligned16(a.weight) && Aligned16(a.bias) &&
                       Aligned16(a.out) &&
                       (a.residual == nullptr || (Aligned16(a.residual) && Aligned16(a.sum)));
  if (a.d == 0 || a.d % kValues != 0 || !aligned) return false;
  const int64_t per_lane = (a.d / kValues + kWarp - 1) / kWarp;
  if (per_lane > kMaxPacksPerLane) return false;
  if (a.rows == 0) return true;
  TORCH_CHECK((a.rows + kRowsPerBlock - 1) / kRowsPerBlock <= int64_t{INT32_MAX},
              "qpool::layer_norm: ", a.rows, " rows");
  LaunchFitting<T>(a, per_lane, stream);
  return true;
}

}  // namespace

bool LaunchLayerNorm(const LayerNormArgs& args, cudaStream_t stream) {
  bool launched = false;
  WithElemType(args.type, [&](auto zero) { launched = Launch<decltype(zero)>(args, stream); });
  return launched;
}

}  // namespace qpool::quant::cuda
