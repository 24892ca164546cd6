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

// The largest head size LaunchRmsRope takes: each lane of a warp holds up to four channel pairs.
inline constexpr int64_t kRmsRopeMaxD = 256;

// One part of qpool::rms_rope (Note [Normed rotary embedding op]): x [rows, n, heads, d] of `type`
// with element strides (stride_row, stride_token, stride_head) and contiguous channels, its norm
// weight [d] of `type`, written RMS-normed and rotated into tokens [offset, offset + n) of the
// contiguous out [rows, total_tokens, heads, d]; cos and sin contiguous float32 [total_tokens,
// d]; d even and at most kRmsRopeMaxD.
struct RmsRopePart {
  const void* x;
  int64_t stride_row, stride_token, stride_head;
  const void* weight;
  int64_t n, offset;
};
void LaunchRmsRope(const RmsRopePart& part, float eps, const float* cos, const float* sin,
                   int64_t rows, int64_t total_tokens, int64_t heads, int64_t d, void* out,
                   ElemType type, cudaStream_t stream);

}  // namespace qpool::quant::cuda
