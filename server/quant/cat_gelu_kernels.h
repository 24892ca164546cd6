// The CUDA kernel of qpool::cat_gelu (Note [Joined GELU op]) behind a torch-free interface (raw
// pointers + stream), like rope_kernels.h. Caller: cat_gelu_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out [rows, da + db] (contiguous) = [a row, gelu(b row)] for a [rows, da] and b [rows, db] of
// `type` with row strides stride_a and stride_b (elements) and contiguous rows.
void LaunchCatGelu(const void* a, int64_t stride_a, const void* b, int64_t stride_b, int64_t rows,
                   int64_t da, int64_t db, void* out, ElemType type, cudaStream_t stream);

}  // namespace qpool::quant::cuda
