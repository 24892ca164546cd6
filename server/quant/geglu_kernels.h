// The CUDA kernel of qpool::geglu (Note [GEGLU op]) behind a torch-free interface (raw pointers +
// stream), like cat_gelu_kernels.h. Caller: geglu_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out [rows, d] (contiguous) = x[:, :d] * gelu(x[:, d:]) for x [rows, 2d] of `type` with row
// stride stride_x (elements) and contiguous rows.
void LaunchGeglu(const void* x, int64_t stride_x, int64_t rows, int64_t d, void* out, ElemType type,
                 cudaStream_t stream);

}  // namespace qpool::quant::cuda
