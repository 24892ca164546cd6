#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/upsample_kernels.h"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;

int64_t ElemBytes(ElemType type) { return type == ElemType::kFloat ? 4 : 2; }

// Each thread copies one 16-byte pack of one input pixel's channels to the 2x2 output pixels it
// becomes. Input line n * h + y becomes output lines 2 (n * h + y) and the one after, and
// column x columns 2x and 2x + 1, so the four stores are two pairs of adjacent packs; the threads
// of a warp take consecutive packs, so each of the four stores is coalesced.
__global__ void UpsampleNearest2xKernel(const uint4* __restrict__ x, uint4* __restrict__ out,
                                        int64_t packs, int64_t row_packs, int64_t w) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t out_line = 2 * w * row_packs;  // packs per output line
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    const int64_t pack = i % row_packs;
    const int64_t pixel = i / row_packs;
    const int64_t column = pixel % w;
    const int64_t line = pixel / w;
    const uint4 v = x[i];
    const int64_t top = 2 * line * out_line + 2 * column * row_packs + pack;
    out[top] = v;
    out[top + row_packs] = v;
    out[top + out_line] = v;
    out[top + out_line + row_packs] = v;
  }
}

}  // namespace

bool UpsampleSupported(const UpsampleArgs& a) {
  return (a.c * ElemBytes(a.type)) % 16 == 0 && Aligned16(a.x) && Aligned16(a.out);
}

void LaunchUpsample(const UpsampleArgs& a, cudaStream_t stream) {
  const int64_t row_packs = a.c * ElemBytes(a.type) / 16;
  const int64_t packs = a.n * a.h * a.w * row_packs;
  if (packs == 0) return;
  const int64_t blocks =
      std::min<int64_t>((packs + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  UpsampleNearest2xKernel<<<blocks, kThreads, 0, stream>>>(
      static_cast<const uint4*>(a.x), static_cast<uint4*>(a.out), packs, row_packs, a.w);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qpool::quant::cuda
