#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/w8a8_kernels.h"

namespace qpool::quant::cuda {
namespace {

// Note [Fused W8A8 kernels]
// In ATen operations (W8A8Linear) a w8a8 layer on CUDA ran about fifteen kernels around the
// int8 GEMM, writing float32 copies of x [M, K] and of the product [M, N] several times each;
// at SD 1.5's M = 8192 tokens that made the w8a8 UNet 2.5x slower than the fp16 one. Two kernels
// replace them: one pass over each row of x quantizes it (its absolute maximum, then the int8
// values, reading the row twice from cache), and one pass over the int32 product scales it and
// adds the bias. They compute the same float32 operations in the same order as the ATen form,
// each rounded (__fdiv_rn, __fmul_rn, __fadd_rn: no contraction into fused multiply-adds), so
// the CPU and CUDA give identical bytes. (ATen's CUDA division by a host scalar multiplies by
// its reciprocal, which is not the CPU's division; hence no ATen scalar division here.)
constexpr int kRowThreads = 256;
constexpr int kEpilogueThreads = 256;
constexpr int kEpilogueVector = 4;

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    QuantizeRowsKernel(const T* __restrict__ x, const float* __restrict__ smooth, int64_t k,
                       int8_t* __restrict__ q, float* __restrict__ row_amax) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < k; i += kRowThreads)
    m = fmaxf(m, fabsf(__fdiv_rn(ToFloat(xr[i]), smooth[i])));
  __shared__ float warp_max[kRowThreads / kWarp];
  for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kRowThreads / kWarp ? warp_max[lane] : 0.f;
    for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) warp_max[0] = m;
  }
  __syncthreads();
  m = warp_max[0];
  if (threadIdx.x == 0) row_amax[row] = m;
  const float d = m == 0.f ? 1.f : m;
  int8_t* qr = q + row * k;
  for (int64_t i = threadIdx.x; i < k; i += kRowThreads) {
    const float v = rintf(__fmul_rn(__fdiv_rn(__fdiv_rn(ToFloat(xr[i]), smooth[i]), d), 127.f));
    qr[i] = static_cast<int8_t>(fminf(fmaxf(v, -127.f), 127.f));
  }
}

template <typename T>
__global__ void __launch_bounds__(kEpilogueThreads)
    EpilogueKernel(const int32_t* __restrict__ acc, const float* __restrict__ row_amax,
                   const float* __restrict__ absmax, const float* __restrict__ bias, int64_t m,
                   int64_t n, T* __restrict__ out) {
  const int64_t vectors = m * n / kEpilogueVector;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = v * kEpilogueVector;
    const int64_t r = i / n;
    const int64_t c = i % n;  // n % 4 == 0: the four values share a row
    const int4 a = *reinterpret_cast<const int4*>(acc + i);
    const int av[kEpilogueVector] = {a.x, a.y, a.z, a.w};
    const float ra = __fdiv_rn(row_amax[r], 127.f);
#pragma unroll
    for (int j = 0; j < kEpilogueVector; ++j) {
      float y = __fmul_rn(__fmul_rn(__int2float_rn(av[j]), ra), __fdiv_rn(absmax[c + j], 127.f));
      if (bias != nullptr) y = __fadd_rn(y, bias[c + j]);
      out[i + j] = FromFloat<T>(y);
    }
  }
}

}  // namespace

void LaunchW8A8QuantizeRows(const void* x, ElemType type, const float* smooth, int64_t m, int64_t k,
                            int8_t* q, float* row_amax, cudaStream_t stream) {
  if (m == 0) return;
  WithElemType(type, [&](auto t) {
    using T = decltype(t);
    QuantizeRowsKernel<T><<<static_cast<unsigned>(m), kRowThreads, 0, stream>>>(
        static_cast<const T*>(x), smooth, k, q, row_amax);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void LaunchW8A8Epilogue(const int32_t* acc, const float* row_amax, const float* absmax,
                        const float* bias, int64_t m, int64_t n, void* out, ElemType type,
                        cudaStream_t stream) {
  TORCH_CHECK(n % kEpilogueVector == 0, "w8a8 epilogue: n = ", n, " is no multiple of 4");
  const int64_t vectors = m * n / kEpilogueVector;
  if (vectors == 0) return;
  const int64_t blocks =
      std::min<int64_t>((vectors + kEpilogueThreads - 1) / kEpilogueThreads, int64_t{65535} * 8);
  WithElemType(type, [&](auto t) {
    using T = decltype(t);
    EpilogueKernel<T><<<static_cast<unsigned>(blocks), kEpilogueThreads, 0, stream>>>(
        acc, row_amax, absmax, bias, m, n, static_cast<T*>(out));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qpool::quant::cuda
