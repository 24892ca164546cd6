#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/bias_residual_kernels.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kThreads = kElementwiseThreads;

// Each thread adds kValues consecutive values: channels of one pixel (kChannelsLast), or pixels
// of one channel, which share a bias value (NCHW; the pixels per channel are a multiple of
// kValues).
template <typename T, int kValues, int kAlign, bool kChannelsLast>
__global__ void BiasResidualKernel(const T* __restrict__ x, const T* __restrict__ bias,
                                   const T* __restrict__ residual, T* __restrict__ out,
                                   int64_t packs, int64_t packs_per_run, int64_t c) {
  using P = Pack<T, kValues, kAlign>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    const P xv = reinterpret_cast<const P*>(x)[i];
    const P rv = reinterpret_cast<const P*>(residual)[i];
    P bv;
    if constexpr (kChannelsLast) {
      bv = *reinterpret_cast<const P*>(bias + (i % packs_per_run) * kValues);
    } else {
      const T b = bias[(i / packs_per_run) % c];
#pragma unroll
      for (int j = 0; j < kValues; ++j) bv.v[j] = b;
    }
    P o;
#pragma unroll
    for (int j = 0; j < kValues; ++j) {
      // Two additions, each rounded to T, as ATen's bias pass and residual addition are.
      const float biased = ToFloat(FromFloat<T>(ToFloat(xv.v[j]) + ToFloat(bv.v[j])));
      o.v[j] = FromFloat<T>(ToFloat(rv.v[j]) + biased);
    }
    reinterpret_cast<P*>(out)[i] = o;
  }
}

template <typename T, int kValues, int kAlign>
void LaunchLayout(const BiasResidualArgs& a, cudaStream_t stream) {
  const int64_t run = a.channels_last ? a.c : a.pixels;  // values between bias changes
  const int64_t packs = a.n * a.c * a.pixels / kValues;
  if (packs == 0) return;
  const int64_t blocks =
      std::min<int64_t>((packs + kThreads - 1) / kThreads, int64_t{SmCount()} * 16);
  const auto* x = static_cast<const T*>(a.x);
  const auto* bias = static_cast<const T*>(a.bias);
  const auto* residual = static_cast<const T*>(a.residual);
  auto* out = static_cast<T*>(a.out);
  if (a.channels_last) {
    BiasResidualKernel<T, kValues, kAlign, true>
        <<<blocks, kThreads, 0, stream>>>(x, bias, residual, out, packs, run / kValues, a.c);
  } else {
    BiasResidualKernel<T, kValues, kAlign, false>
        <<<blocks, kThreads, 0, stream>>>(x, bias, residual, out, packs, run / kValues, a.c);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void Launch(const BiasResidualArgs& a, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const int64_t run = a.channels_last ? a.c : a.pixels;
  const bool wide = run % kWide == 0 && Aligned16(a.x) && Aligned16(a.residual) &&
                    Aligned16(a.out) && (!a.channels_last || Aligned16(a.bias));
  if (wide) {
    LaunchLayout<T, kWide, 16>(a, stream);
  } else {
    LaunchLayout<T, 1, alignof(T)>(a, stream);
  }
}

}  // namespace

void LaunchBiasResidual(const BiasResidualArgs& args, cudaStream_t stream) {
  WithElemType(args.type, [&](auto zero) { Launch<decltype(zero)>(args, stream); });
}

}  // namespace qpool::quant::cuda
