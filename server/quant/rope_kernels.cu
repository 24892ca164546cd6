#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/rope_kernels.h"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;

// Each thread rotates kValues consecutive values (kValues / 2 channel pairs): 16 bytes where d
// is a multiple of them and x and out are 16-byte aligned, else one pair.
template <typename T, int kValues, int kAlign>
__global__ void RopeKernel(const T* __restrict__ x, const float* __restrict__ cos,
                           const float* __restrict__ sin, T* __restrict__ out, int64_t total,
                           int64_t row_values, int64_t n, int64_t d) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kValues;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kValues;
       i < total; i += stride) {
    const int64_t table = ((i / row_values) % n) * d + i % d;  // the token's row, the channel
    using P = Pack<T, kValues, kAlign>;
    P p = *reinterpret_cast<const P*>(x + i);
#pragma unroll
    for (int j = 0; j < kValues; j += 2) {
      const float a = ToFloat(p.v[j]), b = ToFloat(p.v[j + 1]);
      // (a cos - b sin, b cos + a sin): each product rounded, then their sum (Note [Rotary
      // embedding op]).
      const float first = __fadd_rn(__fmul_rn(a, cos[table + j]), __fmul_rn(-b, sin[table + j]));
      const float second =
          __fadd_rn(__fmul_rn(b, cos[table + j + 1]), __fmul_rn(a, sin[table + j + 1]));
      p.v[j] = FromFloat<T>(first);
      p.v[j + 1] = FromFloat<T>(second);
    }
    *reinterpret_cast<P*>(out + i) = p;
  }
}

template <typename T>
void Launch(const T* x, const float* cos, const float* sin, int64_t total, int64_t row_values,
            int64_t n, int64_t d, T* out, cudaStream_t stream) {
  if (total == 0) return;
  constexpr int kWide = 16 / sizeof(T);
  const bool wide = d % kWide == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int values = wide ? kWide : 2;
  const int64_t blocks =
      std::min<int64_t>((total / values + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  if (wide) {
    RopeKernel<T, kWide, 16>
        <<<blocks, kThreads, 0, stream>>>(x, cos, sin, out, total, row_values, n, d);
  } else {
    RopeKernel<T, 2, alignof(T)>
        <<<blocks, kThreads, 0, stream>>>(x, cos, sin, out, total, row_values, n, d);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// One warp per head vector (Note [Normed rotary embedding op]): lane l holds the channel pairs
// l, l + 32, ... (kPairs of them at most), so the warp's loads of a vector are contiguous; the
// sum of squares is reduced across the warp, then each pair is normed (rounded to T, as
// aten::rms_norm's output is) and rotated as RopeKernel does.
template <typename T, int kPairs>
__global__ void RmsRopeKernel(const T* __restrict__ x, int64_t stride_row, int64_t stride_token,
                              int64_t stride_head, const T* __restrict__ weight, float eps,
                              const float* __restrict__ cos, const float* __restrict__ sin,
                              T* __restrict__ out, int64_t rows, int64_t n, int64_t offset,
                              int64_t total_tokens, int64_t heads, int d) {
  const int lane = threadIdx.x % 32;
  const int64_t vectors = rows * n * heads;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int pairs = d / 2;
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; v < vectors;
       v += warps) {
    const int64_t head = v % heads, token = (v / heads) % n, row = v / (heads * n);
    const T* src = x + row * stride_row + token * stride_token + head * stride_head;
    float a[kPairs], b[kPairs];
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int p = lane + 32 * k;
      a[k] = b[k] = 0.f;
      if (p < pairs) {
        a[k] = ToFloat(src[2 * p]);
        b[k] = ToFloat(src[2 * p + 1]);
        sum += a[k] * a[k] + b[k] * b[k];
      }
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
    const float rstd = rsqrtf(sum / static_cast<float>(d) + eps);
    const int64_t t = offset + token;
    T* dst = out + ((row * total_tokens + t) * heads + head) * d;
    const float* c = cos + t * d;
    const float* s = sin + t * d;
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int p = lane + 32 * k;
      if (p >= pairs) continue;
      const int j = 2 * p;
      const float y0 = ToFloat(FromFloat<T>(a[k] * rstd * ToFloat(weight[j])));
      const float y1 = ToFloat(FromFloat<T>(b[k] * rstd * ToFloat(weight[j + 1])));
      dst[j] = FromFloat<T>(__fadd_rn(__fmul_rn(y0, c[j]), __fmul_rn(-y1, s[j])));
      dst[j + 1] = FromFloat<T>(__fadd_rn(__fmul_rn(y1, c[j + 1]), __fmul_rn(y0, s[j + 1])));
    }
  }
}

template <typename T, int kPairs>
void LaunchRmsRopeAs(const RmsRopePart& part, float eps, const float* cos, const float* sin,
                     int64_t rows, int64_t total_tokens, int64_t heads, int64_t d, void* out,
                     cudaStream_t stream) {
  const int64_t vectors = rows * part.n * heads;
  if (vectors == 0) return;
  constexpr int64_t kWarps = kThreads / 32;
  const int64_t blocks =
      std::min<int64_t>((vectors + kWarps - 1) / kWarps, int64_t{SmCount()} * 32);
  RmsRopeKernel<T, kPairs><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(part.x), part.stride_row, part.stride_token, part.stride_head,
      static_cast<const T*>(part.weight), eps, cos, sin, static_cast<T*>(out), rows, part.n,
      part.offset, total_tokens, heads, static_cast<int>(d));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void LaunchRmsRopeFor(const RmsRopePart& part, float eps, const float* cos, const float* sin,
                      int64_t rows, int64_t total_tokens, int64_t heads, int64_t d, void* out,
                      cudaStream_t stream) {
  if (d <= 64) {
    LaunchRmsRopeAs<T, 1>(part, eps, cos, sin, rows, total_tokens, heads, d, out, stream);
  } else if (d <= 128) {
    LaunchRmsRopeAs<T, 2>(part, eps, cos, sin, rows, total_tokens, heads, d, out, stream);
  } else {
    LaunchRmsRopeAs<T, 4>(part, eps, cos, sin, rows, total_tokens, heads, d, out, stream);
  }
}

}  // namespace

void LaunchRmsRope(const RmsRopePart& part, float eps, const float* cos, const float* sin,
                   int64_t rows, int64_t total_tokens, int64_t heads, int64_t d, void* out,
                   ElemType type, cudaStream_t stream) {
  switch (type) {
    case ElemType::kFloat:
      LaunchRmsRopeFor<float>(part, eps, cos, sin, rows, total_tokens, heads, d, out, stream);
      break;
    case ElemType::kHalf:
      LaunchRmsRopeFor<__half>(part, eps, cos, sin, rows, total_tokens, heads, d, out, stream);
      break;
    case ElemType::kBFloat16:
      LaunchRmsRopeFor<__nv_bfloat16>(part, eps, cos, sin, rows, total_tokens, heads, d, out,
                                      stream);
      break;
  }
}

void LaunchRope(const void* x, const float* cos, const float* sin, int64_t rows, int64_t n,
                int64_t heads, int64_t d, void* out, ElemType type, cudaStream_t stream) {
  const int64_t total = rows * n * heads * d, row_values = heads * d;
  switch (type) {
    case ElemType::kFloat:
      Launch(static_cast<const float*>(x), cos, sin, total, row_values, n, d,
             static_cast<float*>(out), stream);
      break;
    case ElemType::kHalf:
      Launch(static_cast<const __half*>(x), cos, sin, total, row_values, n, d,
             static_cast<__half*>(out), stream);
      break;
    case ElemType::kBFloat16:
      Launch(static_cast<const __nv_bfloat16*>(x), cos, sin, total, row_values, n, d,
             static_cast<__nv_bfloat16*>(out), stream);
      break;
  }
}

}  // namespace qpool::quant::cuda
