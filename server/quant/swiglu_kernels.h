// The CUDA kernel of qpool::swiglu (Note [SwiGLU op]) behind a torch-free interface (raw pointers
// + stream), like geglu_kernels.h. Caller: swiglu_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out [rows, d] (contiguous) = silu(x[:, :d]) * x[:, d:] (* weight[:, None] where weight, [rows]
// contiguous, is not null) for x [rows, 2d] of `type` with row stride stride_x (elements) and
// contiguous rows.
void LaunchSwiglu(const void* x, int64_t stride_x, const void* weight, int64_t rows, int64_t d,
                  void* out, ElemType type, cudaStream_t stream);

}  // namespace qpool::quant::cuda
