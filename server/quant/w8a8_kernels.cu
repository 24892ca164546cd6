#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/w8a8_kernels.h"
#include "quant/w8a8_rows.cuh"

namespace qpool::quant::cuda {
namespace {

// Note [Fused W8A8 kernels]
// In ATen operations (W8A8Linear) a w8a8 layer on CUDA ran about fifteen kernels around the
// int8 GEMM, writing float32 copies of x [M, K] and of the product [M, N] several times each;
// at SD 1.5's M = 8192 tokens that made the w8a8 UNet much slower than the fp16 one
// (bench/results/README.md, "Compiled components, W8A8 and the compiled peer"). Two kernels
// replace them: one pass over each row of x quantizes it (its absolute maximum, then the int8
// values; Note [Held rows]), and one pass over the int32 product scales it and adds the bias.
// They compute the same float32 operations in the same order as the ATen form, each rounded
// (__fdiv_rn, __fmul_rn, __fadd_rn: no contraction into fused multiply-adds), so the CPU and
// CUDA give identical bytes. (ATen's CUDA division by a host scalar multiplies by
// its reciprocal, which is not the CPU's division; hence no ATen scalar division here.)
//
// Note [Held rows]
// The quantizing pass computes x / smooth and then xs / d per value, each correctly rounded (the
// CPU's bytes need them; Note [Division by the row's reciprocal]). Rows of 16-bit x whose width is
// a multiple of 8 (16-byte aligned, at most kHeldMaxK values) are quantized by a group of kGroup
// threads that hold the row's x / smooth in registers between the maximum and the int8 values: each
// value is loaded and divided by smooth once, where the first version (one warp a row, reading the
// row again for the second pass) divided twice and left most of a warp idle on SD 1.5's 320-value
// rows. A group of 8 to 256 threads (a power of two, the smallest that holds the row in at most
// kMaxChunks 16-byte chunks a thread) takes a row; each thread holds exactly the chunks the row
// needs. More chunks a thread (fewer threads a row, as in a first choice of 8, 32 or 128) ran
// slower on rows of 640 and 2048 values: registers limit the warps resident. For the same reason
// the kernel is held to 64 registers a thread (four blocks a multiprocessor), which made rows of
// 5120 values faster at the cost of a few bytes spilled. Other rows take one block each. All
// compute each value with the same operations.
//
// Note [Division by the row's reciprocal]
// The pass was bound by its arithmetic, not by memory: it took several times as long as a copy of
// the same bytes, and the IEEE division of each value by its row's divisor d (a reciprocal on the
// special-function unit, refinement and a range check, per value) was most of it. Each thread now
// takes y = RN(1 / d) once a row and divides by two corrections:
//   q0 = RN(xs y),  q1 = q0 + RN(xs - d q0) y,  q = q1 + RN(xs - d q1) y   (fused multiply-adds)
// y is within half an ulp of 1 / d and q1 within an ulp of xs / d, so q = RN(xs / d) (Markstein's
// theorem; the last residual is exact) wherever nothing underflows or overflows. Since |xs| <= d,
// that holds for 2^-60 <= d <= 2^100 (a quotient below 2^-20 becomes 0 either way; above it every
// operand and residual is a normal float); rows outside the range (and NaN or infinite d) divide.
// The int8 value of RN(t * 127) clamped to [-127, 127] is the low byte of that number plus
// 1.5 * 2^23, rounded to nearest even by the addition (no conversion instruction). The bytes are
// the CPU's (GPU test, with rows of every magnitude); the pass's time is in bench/results/README.md
// ("The quantizing pass's arithmetic"). The division by smooth stays an IEEE division: by
// reciprocals it would need them per feature, either kept beside smooth (one more tensor a layer)
// or computed once a block (a persistent kernel, which measured slower).
//
// Note [Unit scales]
// Most w8a8 layers divide by scales of 1: an import without SmoothQuant writes ones, and one with
// it folds the scales of most layers into the layers that produce their inputs (Note [Folded
// smoothing] in tools/qpool_export/qpool_export/smoothquant.py). x / 1 is x (a NaN stays a NaN),
// so the held-row kernel tests each chunk's eight scales and skips their divisions when all are
// 1: the same bytes, without the pass's costliest instructions. The test is uniform across a warp
// where whole layers have unit scales; elsewhere it costs eight comparisons a chunk.
constexpr int kRowThreads = 256;
constexpr int kHeldThreads = 256;    // per block: 256 / kGroup rows
constexpr int kHeldBlocksPerSm = 4;  // resident: at most 64 registers a thread
constexpr int kMaxChunks = 5;        // 8-value chunks a thread holds
constexpr int kMaxGroup = 256;
constexpr int64_t kHeldMaxK = int64_t{kMaxGroup} * kMaxChunks * 8;
constexpr int kEpilogueThreads = 256;
constexpr int kEpilogueVector = 4;

// The rows a held-row kernel quantizes (Note [Held rows]): operator()(row, i, v) sets v to
// values i .. i + 7 of the row (i a multiple of 8).
// The rows of 16-bit x [m, k], contiguous, 16-byte aligned.
template <typename T>
struct PlainRows {
  const T* x;
  int64_t k;
  __device__ __forceinline__ void operator()(int64_t row, int64_t i, float (&v)[8]) const {
    const uint4 u = *reinterpret_cast<const uint4*>(x + row * k + i);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = ToFloat(e[j]);
  }
};

// The rows of qpool::geglu's output for 16-bit x [m, 2k] with row stride `stride` (Note [GEGLU
// op]; Note [GEGLU rows]), each value as GegluKernel writes it, computed and never stored.
template <typename T>
struct GegluRows {
  const T* x;
  int64_t stride, k;
  __device__ __forceinline__ void operator()(int64_t row, int64_t i, float (&v)[8]) const {
    const T* xr = x + row * stride + i;
    const uint4 value = *reinterpret_cast<const uint4*>(xr);
    const uint4 gate = *reinterpret_cast<const uint4*>(xr + k);
    const T* ev = reinterpret_cast<const T*>(&value);
    const T* eg = reinterpret_cast<const T*>(&gate);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = ToFloat(GegluValue(ev[j], eg[j]));
  }
};

// Values i .. i + 7 of row `row` divided by smooth[i .. i + 7] (Note [Unit scales]).
template <typename Rows>
__device__ __forceinline__ void LoadScaled8(const Rows& rows, int64_t row, const float* smooth,
                                            int64_t i, float (&xs)[8]) {
  rows(row, i, xs);
  DivideBySmooth8(smooth, i, xs);
}

// Note [Held rows]: m rows of k values, kGroup threads each, kChunks chunks per thread.
template <typename Rows, int kGroup, int kChunks>
__global__ void __launch_bounds__(kHeldThreads, kHeldBlocksPerSm)
    QuantizeHeldRowsKernel(Rows rows, const float* __restrict__ smooth, int64_t m, int64_t k,
                           int8_t* __restrict__ q, float* __restrict__ row_amax,
                           float* __restrict__ row_scale) {
  constexpr int kGroupWarps = kGroup > kWarp ? kGroup / kWarp : 1;
  constexpr int kWidth = kGroup < kWarp ? kGroup : kWarp;
  __shared__ float warp_max[kHeldThreads / kWarp];
  const int64_t row = (blockIdx.x * int64_t{kHeldThreads} + threadIdx.x) / kGroup;
  const int g = threadIdx.x % kGroup;
  const bool valid = row < m;  // every thread reaches the shuffles and the barrier
  float xs[kChunks][8];
  float mx = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = 8 * (g + int64_t{c} * kGroup);
    if (valid && i < k) {
      LoadScaled8(rows, row, smooth, i, xs[c]);
#pragma unroll
      for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fabsf(xs[c][j]));
    }
  }
  for (int o = kWidth / 2; o > 0; o /= 2) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o, kWidth));
  }
  if constexpr (kGroupWarps > 1) {
    const int warp = threadIdx.x / kWarp;
    if (threadIdx.x % kWarp == 0) warp_max[warp] = mx;
    __syncthreads();
    const int first = warp - warp % kGroupWarps;
#pragma unroll
    for (int w = 0; w < kGroupWarps; ++w) mx = fmaxf(mx, warp_max[first + w]);
  }
  if (!valid) return;
  if (g == 0) StoreRowMax(mx, row, row_amax, row_scale);
  const RowDivisor div = DivisorOf(mx);
  int8_t* qr = q + row * k;
  WithDivision(div, [&](auto by_reciprocal) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = 8 * (g + int64_t{c} * kGroup);
      if (i < k) {
        *reinterpret_cast<uint2*>(qr + i) = div.Quantize8<decltype(by_reciprocal)::value>(xs[c]);
      }
    }
  });
}

// Launches the kernel of the smallest group (8 to kMaxGroup threads) that holds a row of k values
// in at most kMaxChunks chunks a thread, whose threads hold exactly the chunks the row needs.
template <typename Rows, int kGroup = 8, int kChunks = 1>
void LaunchHeldRows(const Rows& rows, const float* smooth, int64_t m, int64_t k, int8_t* q,
                    float* row_amax, float* row_scale, cudaStream_t stream) {
  if constexpr (kChunks < kMaxChunks) {
    if (k > int64_t{8} * kGroup * kChunks) {
      return LaunchHeldRows<Rows, kGroup, kChunks + 1>(rows, smooth, m, k, q, row_amax, row_scale,
                                                       stream);
    }
  } else if constexpr (kGroup < kMaxGroup) {
    if (k > int64_t{8} * kGroup * kChunks) {
      return LaunchHeldRows<Rows, kGroup * 2, (kMaxChunks + 1) / 2>(rows, smooth, m, k, q, row_amax,
                                                                    row_scale, stream);
    }
  }
  constexpr int kRowsPerBlock = kHeldThreads / kGroup;
  const int64_t blocks = (m + kRowsPerBlock - 1) / kRowsPerBlock;
  TORCH_CHECK(blocks <= int64_t{INT32_MAX}, "w8a8: ", m, " rows");
  QuantizeHeldRowsKernel<Rows, kGroup, kChunks>
      <<<static_cast<unsigned>(blocks), kHeldThreads, 0, stream>>>(rows, smooth, m, k, q, row_amax,
                                                                   row_scale);
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    QuantizeRowsKernel(const T* __restrict__ x, const float* __restrict__ smooth, int64_t k,
                       int8_t* __restrict__ q, float* __restrict__ row_amax,
                       float* __restrict__ row_scale) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < k; i += kRowThreads)
    m = fmaxf(m, fabsf(__fdiv_rn(ToFloat(xr[i]), smooth[i])));
  __shared__ float warp_max[kRowThreads / kWarp];
  for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kRowThreads / kWarp ? warp_max[lane] : 0.f;
    for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) warp_max[0] = m;
  }
  __syncthreads();
  m = warp_max[0];
  if (threadIdx.x == 0) StoreRowMax(m, row, row_amax, row_scale);
  const RowDivisor div = DivisorOf(m);
  int8_t* qr = q + row * k;
  WithDivision(div, [&](auto by_reciprocal) {
    for (int64_t i = threadIdx.x; i < k; i += kRowThreads) {
      const float xs = __fdiv_rn(ToFloat(xr[i]), smooth[i]);
      qr[i] = static_cast<int8_t>(div.Quantize<decltype(by_reciprocal)::value>(xs));
    }
  });
}

template <typename T>
__global__ void __launch_bounds__(kEpilogueThreads)
    EpilogueKernel(const int32_t* __restrict__ acc, const float* __restrict__ row_amax,
                   const float* __restrict__ absmax, const float* __restrict__ bias, int64_t m,
                   int64_t n, T* __restrict__ out) {
  const int64_t vectors = m * n / kEpilogueVector;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = v * kEpilogueVector;
    const int64_t r = i / n;
    const int64_t c = i % n;  // n % 4 == 0: the four values share a row
    const int4 a = *reinterpret_cast<const int4*>(acc + i);
    const int av[kEpilogueVector] = {a.x, a.y, a.z, a.w};
    const float ra = __fdiv_rn(row_amax[r], 127.f);
#pragma unroll
    for (int j = 0; j < kEpilogueVector; ++j) {
      float y = __fmul_rn(__fmul_rn(__int2float_rn(av[j]), ra), __fdiv_rn(absmax[c + j], 127.f));
      if (bias != nullptr) y = __fadd_rn(y, bias[c + j]);
      out[i + j] = FromFloat<T>(y);
    }
  }
}

}  // namespace

void LaunchW8A8QuantizeRows(const void* x, ElemType type, const float* smooth, int64_t m, int64_t k,
                            int8_t* q, float* row_amax, float* row_scale, cudaStream_t stream) {
  if (m == 0) return;
  WithElemType(type, [&](auto t) {
    using T = decltype(t);
    const T* xt = static_cast<const T*>(x);
    if constexpr (sizeof(T) == 2) {
      if (k <= kHeldMaxK && k % 8 == 0 && Aligned16(x) && Aligned16(smooth) && Aligned16(q)) {
        LaunchHeldRows(PlainRows<T>{xt, k}, smooth, m, k, q, row_amax, row_scale, stream);
        return;
      }
    }
    QuantizeRowsKernel<T><<<static_cast<unsigned>(m), kRowThreads, 0, stream>>>(
        xt, smooth, k, q, row_amax, row_scale);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool W8A8GegluRowsSupported(const void* x, int64_t stride_x, int64_t d, ElemType type,
                            const float* smooth) {
  return type != ElemType::kFloat && d > 0 && d <= kHeldMaxK && d % 8 == 0 && stride_x >= 2 * d &&
         stride_x % 8 == 0 && Aligned16(x) && Aligned16(smooth);
}

void LaunchW8A8GegluQuantizeRows(const void* x, int64_t stride_x, ElemType type,
                                 const float* smooth, int64_t m, int64_t d, int8_t* q,
                                 float* row_amax, float* row_scale, cudaStream_t stream) {
  TORCH_CHECK(W8A8GegluRowsSupported(x, stride_x, d, type, smooth) && Aligned16(q),
              "w8a8: GEGLU rows of ", d, " values (row stride ", stride_x,
              ") cannot be quantized in one pass");
  if (m == 0) return;
  WithElemType(type, [&](auto t) {
    using T = decltype(t);
    if constexpr (sizeof(T) == 2) {
      LaunchHeldRows(GegluRows<T>{static_cast<const T*>(x), stride_x, d}, smooth, m, d, q, row_amax,
                     row_scale, stream);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void LaunchW8A8Epilogue(const int32_t* acc, const float* row_amax, const float* absmax,
                        const float* bias, int64_t m, int64_t n, void* out, ElemType type,
                        cudaStream_t stream) {
  TORCH_CHECK(n % kEpilogueVector == 0, "w8a8 epilogue: n = ", n, " is no multiple of 4");
  const int64_t vectors = m * n / kEpilogueVector;
  if (vectors == 0) return;
  const int64_t blocks =
      std::min<int64_t>((vectors + kEpilogueThreads - 1) / kEpilogueThreads, int64_t{65535} * 8);
  WithElemType(type, [&](auto t) {
    using T = decltype(t);
    EpilogueKernel<T><<<static_cast<unsigned>(blocks), kEpilogueThreads, 0, stream>>>(
        acc, row_amax, absmax, bias, m, n, static_cast<T*>(out));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qpool::quant::cuda
