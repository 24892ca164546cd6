// The CUDA kernels of qpool::group_norm (Note [Group norm op]) behind a torch-free interface (raw
// pointers + stream), like ada_norm_kernels.h. Caller: group_norm_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// The arguments of one channels-last group norm: x and out [n, pixels, c] of `type`, contiguous
// (an NCHW tensor's channels-last memory), weight and bias [c], add [n, c] (contiguous) or null.
struct GroupNormArgs {
  const void* x = nullptr;
  const void* add = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t n = 0, pixels = 0, c = 0, groups = 0;
  float eps = 0.f;
  bool silu = false;
  ElemType type = ElemType::kFloat;
};

// Whether the kernels take these arguments: c a multiple of one 16-byte vector of `type` and at
// most 512 vectors wide (4096 channels in fp16 / bf16, 2048 in float32), x 16-byte aligned, at
// least one pixel. Reads only x and the sizes, so a caller asks before allocating out.
bool GroupNormSupported(const GroupNormArgs& args);

// Float32 values of workspace LaunchGroupNorm needs (the partial statistics of each block).
int64_t GroupNormWorkspaceFloats(const GroupNormArgs& args);

// Writes out; `workspace` holds GroupNormWorkspaceFloats(args) floats on the device. Requires
// GroupNormSupported(args) and a 16-byte aligned out (every caching-allocator block is).
void LaunchGroupNorm(const GroupNormArgs& args, float* workspace, cudaStream_t stream);

}  // namespace qpool::quant::cuda
