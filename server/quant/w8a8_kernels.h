// CUDA kernels of the w8a8 linear (Note [W8A8 linear], Note [Fused W8A8 kernels]) behind a
// torch-free interface (raw pointers + stream), like quant_kernels.h. Caller:
// quant_linear_cuda.cpp, around at::_int_mm.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// For contiguous x [m, k] of `type` and activation scales smooth float32 [k]: row_amax[r] =
// max_k |x[r, k] / smooth[k]| and q[r, k] = clamp(round_half_even(x[r, k] / smooth[k] / d_r *
// 127), -127, 127) with d_r = row_amax[r], or 1 where it is 0. Bit-identical to the ATen
// operations of W8A8Linear on any device. One block per row.
void LaunchW8A8QuantizeRows(const void* x, ElemType type, const float* smooth, int64_t m, int64_t k,
                            int8_t* q, float* row_amax, cudaStream_t stream);

// out[r, c] = acc[r, c] * (row_amax[r] / 127) * (absmax[c] / 127) + bias[c], each operation
// rounded in float32 (no fused multiply-add), cast to `type`, for contiguous int32 acc and out
// [m, n]; bias float32 [n] or null. n must be a multiple of 4.
void LaunchW8A8Epilogue(const int32_t* acc, const float* row_amax, const float* absmax,
                        const float* bias, int64_t m, int64_t n, void* out, ElemType type,
                        cudaStream_t stream);

}  // namespace qpool::quant::cuda
