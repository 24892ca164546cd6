// The CUDA kernel of qpool::upsample_nearest (Note [Upsample op]) behind a torch-free
// interface (raw pointers + stream), like bias_residual_kernels.h. Caller: upsample_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out [n, 2h, 2w, c] = x [n, h, w, c] with each pixel copied to a 2x2 block, both stored densely
// channels-last; c * the element size a multiple of 16 bytes and both pointers 16-byte aligned.
struct UpsampleArgs {
  const void* x = nullptr;
  void* out = nullptr;
  int64_t n = 0, c = 0, h = 0, w = 0;
  ElemType type = ElemType::kFloat;
};

// Whether the kernel takes these sizes and pointers (Note [Upsample op]).
bool UpsampleSupported(const UpsampleArgs& args);

void LaunchUpsample(const UpsampleArgs& args, cudaStream_t stream);

}  // namespace qpool::quant::cuda
