#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/geglu_kernels.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;

// Each thread writes kValues consecutive values of one output row from the same columns of the
// value half and of the gate half of its input row.
template <typename T, int kValues, int kAlign>
__global__ void GegluKernel(const T* __restrict__ x, int64_t stride_x, T* __restrict__ out,
                            int64_t rows, int64_t d) {
  using P = Pack<T, kValues, kAlign>;
  const int64_t packs_per_row = d / kValues, total = rows * packs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / packs_per_row, col = (i % packs_per_row) * kValues;
    const T* in = x + row * stride_x + col;
    const P value = *reinterpret_cast<const P*>(in);
    const P gate = *reinterpret_cast<const P*>(in + d);
    P o;
#pragma unroll
    for (int j = 0; j < kValues; ++j) o.v[j] = GegluValue(value.v[j], gate.v[j]);
    *reinterpret_cast<P*>(out + row * d + col) = o;
  }
}

template <typename T>
void Launch(const T* x, int64_t stride_x, int64_t rows, int64_t d, T* out, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = d % kWide == 0 && stride_x % kWide == 0 && Aligned16(x) && Aligned16(out);
  const int values = wide ? kWide : 1;
  const int64_t packs = rows * d / values;
  const int64_t blocks =
      std::min<int64_t>((packs + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  if (wide) {
    GegluKernel<T, kWide, 16><<<blocks, kThreads, 0, stream>>>(x, stride_x, out, rows, d);
  } else {
    GegluKernel<T, 1, alignof(T)><<<blocks, kThreads, 0, stream>>>(x, stride_x, out, rows, d);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void LaunchGeglu(const void* x, int64_t stride_x, int64_t rows, int64_t d, void* out, ElemType type,
                 cudaStream_t stream) {
  WithElemType(type, [&](auto zero) {
    using T = decltype(zero);
    Launch(static_cast<const T*>(x), stride_x, rows, d, static_cast<T*>(out), stream);
  });
}

}  // namespace qpool::quant::cuda
