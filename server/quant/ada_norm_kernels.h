// The CUDA kernel of qpool::ada_norm (Note [Modulated norm op]) behind a torch-free interface
// (raw pointers + stream), like rope_kernels.h. Caller: ada_norm_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// x [batch, n, d] of `type` with element strides (stride_batch, stride_token) and contiguous rows;
// shift and scale [batch, d] with row strides stride_shift and stride_scale; out contiguous
// [batch, n, d]. Returns false, launching nothing, where d is too wide for the kernel's registers
// (the caller runs the ATen operations).
bool LaunchAdaNorm(const void* x, int64_t stride_batch, int64_t stride_token, const void* shift,
                   int64_t stride_shift, const void* scale, int64_t stride_scale, int64_t batch,
                   int64_t n, int64_t d, float eps, void* out, ElemType type, cudaStream_t stream);

}  // namespace qpool::quant::cuda
