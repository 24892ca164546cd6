#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/cat_gelu_kernels.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;

// ATen's tanh-approximated GELU, in float32 (Note [Joined GELU op]).
__device__ __forceinline__ float GeluTanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float cube = x * x * x;
  return 0.5f * x * (1.f + tanhf(kBeta * (x + kKappa * cube)));
}

// Each thread writes kValues consecutive values of one output row; da is a multiple of kValues,
// so a pack lies wholly in a or wholly in b.
template <typename T, int kValues, int kAlign>
__global__ void CatGeluKernel(const T* __restrict__ a, int64_t stride_a, const T* __restrict__ b,
                              int64_t stride_b, T* __restrict__ out, int64_t rows, int64_t da,
                              int64_t db) {
  using P = Pack<T, kValues, kAlign>;
  const int64_t width = da + db, packs_per_row = width / kValues, total = rows * packs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / packs_per_row, col = (i % packs_per_row) * kValues;
    P p;
    if (col < da) {
      p = *reinterpret_cast<const P*>(a + row * stride_a + col);
    } else {
      p = *reinterpret_cast<const P*>(b + row * stride_b + (col - da));
#pragma unroll
      for (int j = 0; j < kValues; ++j) p.v[j] = FromFloat<T>(GeluTanh(ToFloat(p.v[j])));
    }
    *reinterpret_cast<P*>(out + row * width + col) = p;
  }
}

template <typename T>
void Launch(const T* a, int64_t stride_a, const T* b, int64_t stride_b, int64_t rows, int64_t da,
            int64_t db, T* out, cudaStream_t stream) {
  if (rows == 0 || da + db == 0) return;
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = da % kWide == 0 && db % kWide == 0 && stride_a % kWide == 0 &&
                    stride_b % kWide == 0 && Aligned16(a) && Aligned16(b) && Aligned16(out);
  const int values = wide ? kWide : 1;
  const int64_t packs = rows * (da + db) / values;
  const int64_t blocks =
      std::min<int64_t>((packs + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  if (wide) {
    CatGeluKernel<T, kWide, 16>
        <<<blocks, kThreads, 0, stream>>>(a, stride_a, b, stride_b, out, rows, da, db);
  } else {
    CatGeluKernel<T, 1, alignof(T)>
        <<<blocks, kThreads, 0, stream>>>(a, stride_a, b, stride_b, out, rows, da, db);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void LaunchCatGelu(const void* a, int64_t stride_a, const void* b, int64_t stride_b, int64_t rows,
                   int64_t da, int64_t db, void* out, ElemType type, cudaStream_t stream) {
  switch (type) {
    case ElemType::kFloat:
      Launch(static_cast<const float*>(a), stride_a, static_cast<const float*>(b), stride_b, rows,
             da, db, static_cast<float*>(out), stream);
      break;
    case ElemType::kHalf:
      Launch(static_cast<const __half*>(a), stride_a, static_cast<const __half*>(b), stride_b, rows,
             da, db, static_cast<__half*>(out), stream);
      break;
    case ElemType::kBFloat16:
      Launch(static_cast<const __nv_bfloat16*>(a), stride_a, static_cast<const __nv_bfloat16*>(b),
             stride_b, rows, da, db, static_cast<__nv_bfloat16*>(out), stream);
      break;
  }
}

}  // namespace qpool::quant::cuda
