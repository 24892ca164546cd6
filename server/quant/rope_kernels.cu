#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/rope_kernels.h"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = 256;

// kValues consecutive values of one row. kAlign is the access's alignment: 16 bytes for the
// wide path (one vector load and store), sizeof(T) for the pair-wise one, which must also take
// x and out that start at any element (a view a value into its storage).
template <typename T, int kValues, int kAlign>
struct alignas(kAlign) Pack {
  T v[kValues];
};

// Each thread rotates kValues consecutive values (kValues / 2 channel pairs): 16 bytes where d
// is a multiple of them and x and out are 16-byte aligned, else one pair.
template <typename T, int kValues, int kAlign>
__global__ void RopeKernel(const T* __restrict__ x, const float* __restrict__ cos,
                           const float* __restrict__ sin, T* __restrict__ out, int64_t total,
                           int64_t row_values, int64_t n, int64_t d) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kValues;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kValues;
       i < total; i += stride) {
    const int64_t table = ((i / row_values) % n) * d + i % d;  // the token's row, the channel
    using P = Pack<T, kValues, kAlign>;
    P p = *reinterpret_cast<const P*>(x + i);
#pragma unroll
    for (int j = 0; j < kValues; j += 2) {
      const float a = ToFloat(p.v[j]), b = ToFloat(p.v[j + 1]);
      // (a cos - b sin, b cos + a sin): each product rounded, then their sum (Note [Rotary
      // embedding op]).
      const float first = __fadd_rn(__fmul_rn(a, cos[table + j]), __fmul_rn(-b, sin[table + j]));
      const float second =
          __fadd_rn(__fmul_rn(b, cos[table + j + 1]), __fmul_rn(a, sin[table + j + 1]));
      p.v[j] = FromFloat<T>(first);
      p.v[j + 1] = FromFloat<T>(second);
    }
    *reinterpret_cast<P*>(out + i) = p;
  }
}

template <typename T>
void Launch(const T* x, const float* cos, const float* sin, int64_t total, int64_t row_values,
            int64_t n, int64_t d, T* out, cudaStream_t stream) {
  if (total == 0) return;
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = d % kWide == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int values = wide ? kWide : 2;
  const int64_t blocks =
      std::min<int64_t>((total / values + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  if (wide) {
    RopeKernel<T, kWide, 16>
        <<<blocks, kThreads, 0, stream>>>(x, cos, sin, out, total, row_values, n, d);
  } else {
    RopeKernel<T, 2, alignof(T)>
        <<<blocks, kThreads, 0, stream>>>(x, cos, sin, out, total, row_values, n, d);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void LaunchRope(const void* x, const float* cos, const float* sin, int64_t rows, int64_t n,
                int64_t heads, int64_t d, void* out, ElemType type, cudaStream_t stream) {
  const int64_t total = rows * n * heads * d, row_values = heads * d;
  switch (type) {
    case ElemType::kFloat:
      Launch(static_cast<const float*>(x), cos, sin, total, row_values, n, d,
             static_cast<float*>(out), stream);
      break;
    case ElemType::kHalf:
      Launch(static_cast<const __half*>(x), cos, sin, total, row_values, n, d,
             static_cast<__half*>(out), stream);
      break;
    case ElemType::kBFloat16:
      Launch(static_cast<const __nv_bfloat16*>(x), cos, sin, total, row_values, n, d,
             static_cast<__nv_bfloat16*>(out), stream);
      break;
  }
}

}  // namespace qpool::quant::cuda
