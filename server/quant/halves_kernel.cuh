// The elementwise kernel that joins the two halves of each row of x [rows, 2d] into one output row
// [rows, d] (qpool::geglu, qpool::swiglu): `f(first, second, row)` gives each output value from
// the same column of the first and the second half. Included by the ops' .cu files only.
#pragma once

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>

#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {

// Each thread writes kValues consecutive values of one output row.
template <typename T, int kValues, int kAlign, typename F>
__global__ void HalvesKernel(const T* __restrict__ x, int64_t stride_x, T* __restrict__ out,
                             int64_t rows, int64_t d, F f) {
  using P = Pack<T, kValues, kAlign>;
  const int64_t packs_per_row = d / kValues, total = rows * packs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / packs_per_row, col = (i % packs_per_row) * kValues;
    const T* in = x + row * stride_x + col;
    const P first = *reinterpret_cast<const P*>(in);
    const P second = *reinterpret_cast<const P*>(in + d);
    P o;
#pragma unroll
    for (int j = 0; j < kValues; ++j) o.v[j] = f(first.v[j], second.v[j], row);
    *reinterpret_cast<P*>(out + row * d + col) = o;
  }
}

// Launches HalvesKernel on `stream`: 16 bytes a thread where the width, the row stride and the
// addresses allow, else value by value. x's rows have stride stride_x (elements); out is
// contiguous.
template <typename T, typename F>
void LaunchHalves(const T* x, int64_t stride_x, int64_t rows, int64_t d, T* out, F f,
                  cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  constexpr int kThreads = kElementwiseThreads;
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = d % kWide == 0 && stride_x % kWide == 0 && Aligned16(x) && Aligned16(out);
  const int values = wide ? kWide : 1;
  const int64_t packs = rows * d / values;
  const int64_t blocks =
      std::min<int64_t>((packs + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  if (wide) {
    HalvesKernel<T, kWide, 16><<<blocks, kThreads, 0, stream>>>(x, stride_x, out, rows, d, f);
  } else {
    HalvesKernel<T, 1, alignof(T)><<<blocks, kThreads, 0, stream>>>(x, stride_x, out, rows, d, f);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qpool::quant::cuda
