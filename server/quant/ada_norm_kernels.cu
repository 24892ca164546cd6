#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/ada_norm_kernels.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;
constexpr int kMaxPacks = 4;  // packs per thread held in registers: d <= 4 * 256 * kValues

// The sum of v over the block; every thread gets it. `shared` holds one float per warp.
__device__ __forceinline__ float BlockSum(float v, float* shared) {
  for (int mask = kWarp / 2; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __syncthreads();  // an earlier call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / kWarp; ++w) total += shared[w];
  return total;
}

// One block per row (Note [Modulated norm op]): thread t holds packs t, t + kThreads, ... of
// kValues values; the mean, then the variance about it, from the registers; then the modulated
// values with the unfused graph's rounding points.
template <typename T, int kValues, int kAlign>
__global__ void AdaNormKernel(const T* __restrict__ x, int64_t stride_batch, int64_t stride_token,
                              const T* __restrict__ shift, int64_t stride_shift,
                              const T* __restrict__ scale, int64_t stride_scale, int64_t n,
                              int64_t d, float eps, T* __restrict__ out) {
  using P = Pack<T, kValues, kAlign>;
  __shared__ float shared[kThreads / kWarp];
  const int64_t row = blockIdx.x, batch = row / n, token = row % n;
  const T* src = x + batch * stride_batch + token * stride_token;
  T* dst = out + row * d;
  const int packs = static_cast<int>(d / kValues);
  float v[kMaxPacks][kValues];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    const int p = threadIdx.x + k * kThreads;
    if (p < packs) {
      const P pack = *reinterpret_cast<const P*>(src + static_cast<int64_t>(p) * kValues);
#pragma unroll
      for (int j = 0; j < kValues; ++j) {
        v[k][j] = ToFloat(pack.v[j]);
        sum += v[k][j];
      }
    }
  }
  const float mean = BlockSum(sum, shared) / static_cast<float>(d);
  float squares = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    if (threadIdx.x + k * kThreads < packs) {
#pragma unroll
      for (int j = 0; j < kValues; ++j) squares += (v[k][j] - mean) * (v[k][j] - mean);
    }
  }
  const float rstd = rsqrtf(BlockSum(squares, shared) / static_cast<float>(d) + eps);
  const T* sh = shift + batch * stride_shift;
  const T* sc = scale + batch * stride_scale;
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    const int p = threadIdx.x + k * kThreads;
    if (p >= packs) continue;
    P pack;
#pragma unroll
    for (int j = 0; j < kValues; ++j) {
      const int64_t c = static_cast<int64_t>(p) * kValues + j;
      const float normed = ToFloat(FromFloat<T>((v[k][j] - mean) * rstd));
      const float factor = ToFloat(FromFloat<T>(ToFloat(sc[c]) + 1.f));
      pack.v[j] = FromFloat<T>(ToFloat(sh[c]) + normed * factor);
    }
    *reinterpret_cast<P*>(dst + static_cast<int64_t>(p) * kValues) = pack;
  }
}

template <typename T>
bool Launch(const T* x, int64_t stride_batch, int64_t stride_token, const T* shift,
            int64_t stride_shift, const T* scale, int64_t stride_scale, int64_t batch, int64_t n,
            int64_t d, float eps, T* out, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = d % kWide == 0 && stride_batch % kWide == 0 && stride_token % kWide == 0 &&
                    Aligned16(x) && Aligned16(out);
  const int64_t values = wide ? kWide : 1;
  if (d > int64_t{kMaxPacks} * kThreads * values || d == 0) return false;
  const int64_t rows = batch * n;
  if (rows == 0) return true;
  TORCH_CHECK(rows <= int64_t{INT32_MAX}, "qpool::ada_norm: ", rows, " rows");
  if (wide) {
    AdaNormKernel<T, kWide, 16><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, stride_batch, stride_token, shift, stride_shift, scale, stride_scale, n, d, eps, out);
  } else {
    AdaNormKernel<T, 1, alignof(T)><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, stride_batch, stride_token, shift, stride_shift, scale, stride_scale, n, d, eps, out);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace

bool LaunchAdaNorm(const void* x, int64_t stride_batch, int64_t stride_token, const void* shift,
                   int64_t stride_shift, const void* scale, int64_t stride_scale, int64_t batch,
                   int64_t n, int64_t d, float eps, void* out, ElemType type, cudaStream_t stream) {
  switch (type) {
    case ElemType::kFloat:
      return Launch(static_cast<const float*>(x), stride_batch, stride_token,
                    static_cast<const float*>(shift), stride_shift,
                    static_cast<const float*>(scale), stride_scale, batch, n, d, eps,
                    static_cast<float*>(out), stream);
    case ElemType::kHalf:
      return Launch(static_cast<const __half*>(x), stride_batch, stride_token,
                    static_cast<const __half*>(shift), stride_shift,
                    static_cast<const __half*>(scale), stride_scale, batch, n, d, eps,
                    static_cast<__half*>(out), stream);
    case ElemType::kBFloat16:
      return Launch(static_cast<const __nv_bfloat16*>(x), stride_batch, stride_token,
                    static_cast<const __nv_bfloat16*>(shift), stride_shift,
                    static_cast<const __nv_bfloat16*>(scale), stride_scale, batch, n, d, eps,
                    static_cast<__nv_bfloat16*>(out), stream);
  }
  return false;
}

}  // namespace qpool::quant::cuda
