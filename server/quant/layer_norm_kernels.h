// The CUDA kernel of qpool::layer_norm and qpool::add_layer_norm (Note [Residual layer norm])
// behind a torch-free interface (raw pointers + stream), like bias_residual_kernels.h. Caller:
// layer_norm_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// out = layer_norm(s) over rows of d values, s = x + residual (written to `sum`, each value
// rounded to `type`) or s = x where residual is null (sum is then unused). x, residual, sum and
// out are [rows, d] with contiguous rows; weight and bias [d], contiguous.
//
// Where q is not null, out is neither written nor read: the normed rows, each value rounded to
// `type`, are quantized for a w8a8 product instead (Note [Quantized norm rows]): q [rows, d],
// row_amax and row_scale (or null) [rows] are LaunchW8A8QuantizeRows's of out with the
// activation scales smooth float32 [d], byte for byte.
struct LayerNormArgs {
  const void* x = nullptr;
  const void* residual = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* sum = nullptr;
  void* out = nullptr;
  const float* smooth = nullptr;
  int8_t* q = nullptr;
  float* row_amax = nullptr;
  float* row_scale = nullptr;
  int64_t rows = 0, d = 0;
  float eps = 0.f;
  ElemType type = ElemType::kFloat;
};

// Returns false, launching nothing, where the rows are too wide for a warp's registers or not a
// multiple of 16 bytes, or a pointer is not 16-byte aligned (the caller runs the ATen
// operations).
bool LaunchLayerNorm(const LayerNormArgs& args, cudaStream_t stream);

// Whether LaunchLayerNorm quantizes these rows: 16-bit values, rows that a warp holds, and
// 16-byte aligned x, residual (where given), weight, bias and smooth. Reads none of the outputs
// (sum, q, row_amax, row_scale), so a caller asks before allocating them; they must be 16-byte
// aligned (every caching-allocator block is).
bool LayerNormQuantizeSupported(const LayerNormArgs& args);

}  // namespace qpool::quant::cuda
