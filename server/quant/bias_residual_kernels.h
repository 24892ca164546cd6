// The CUDA kernel of qpool::bias_residual (Note [Convolution biases]) behind a torch-free
// interface (raw pointers + stream), like geglu_kernels.h. Caller: bias_residual_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out = residual + (x + bias[channel]) for x, residual and out [n, c, pixels] stored densely
// channels-last (pixel-major) or NCHW, each addition rounded to `type`.
struct BiasResidualArgs {
  const void* x = nullptr;
  const void* bias = nullptr;  // [c], contiguous
  const void* residual = nullptr;
  void* out = nullptr;
  int64_t n = 0, c = 0, pixels = 0;
  bool channels_last = false;
  ElemType type = ElemType::kFloat;
};

void LaunchBiasResidual(const BiasResidualArgs& args, cudaStream_t stream);

}  // namespace qpool::quant::cuda
