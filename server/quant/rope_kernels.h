// The CUDA kernel of qpool::rope (Note [Rotary embedding op]) behind a torch-free interface
// (raw pointers + stream), like quant_kernels.h. Caller: rope_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out = rope(x, cos, sin) for contiguous x and out [rows, n, heads, d] of `type` (rows = B) and
// contiguous float32 cos and sin [n, d]; d even.
void LaunchRope(const void* x, const float* cos, const float* sin, int64_t rows, int64_t n,
                int64_t heads, int64_t d, void* out, ElemType type, cudaStream_t stream);

}  // namespace qpool::quant::cuda
