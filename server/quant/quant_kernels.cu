// CUDA kernels for qpool::quant_linear: dequantize int8/nf4 into a workspace (large M, followed
// by cuBLAS) and a fused small-M linear on CUDA cores that reads the packed weights once. The
// tensor-core small-M kernel is in quant_mma_kernels.cu.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {
namespace {

template <typename T, bool kNf4>
__global__ void __launch_bounds__(256)
    DequantizeKernel(PackedWeightView w, T* out, bool wvec, bool ovec) {
  __shared__ float s_code[16];
  __shared__ float s_nested[256];
  LoadTables(w, s_code, s_nested);
  constexpr int kValues = kNf4 ? 2 * kChunkBytes : kChunkBytes;
  const int64_t chunks_per_row = (w.row_bytes + kChunkBytes - 1) / kChunkBytes;
  const int64_t total = w.rows * chunks_per_row;
  const int64_t K = w.in_features;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < total;
       c += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = c / chunks_per_row;
    const int64_t b0 = (c % chunks_per_row) * kChunkBytes;
    const int64_t k0 = kNf4 ? 2 * b0 : b0;
    const int valid_values = static_cast<int>(MinI64(kValues, K - k0));
    if (valid_values <= 0) continue;  // an nf4 chunk made only of row padding
    uint8_t bytes[kChunkBytes];
    LoadChunk(w.weight + n * w.row_bytes + b0,
              static_cast<int>(MinI64(kChunkBytes, w.row_bytes - b0)), wvec, bytes);
    float v[kValues];
    DecodeChunk<kNf4>(bytes, s_code, v);
    __align__(16) T vals[kValues];
    if constexpr (kNf4) {
      float s0, s1;
      ChunkScales(w, s_nested, n, k0, &s0, &s1);
#pragma unroll
      for (int j = 0; j < kValues; ++j) vals[j] = FromFloat<T>(__fmul_rn(v[j], j < 16 ? s0 : s1));
    } else {
      const float scale = __fdiv_rn(w.absmax[n], 127.f);
#pragma unroll
      for (int j = 0; j < kValues; ++j) vals[j] = FromFloat<T>(__fmul_rn(v[j], scale));
    }
    T* dst = out + n * K + k0;
    if (ovec && valid_values == kValues) {
      constexpr int kVecs = kValues * sizeof(T) / 16;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(vals)[i];
      }
    } else {
      for (int j = 0; j < valid_values; ++j) dst[j] = vals[j];
    }
  }
}

// Note [Fast dequantize]
// When rows need no padding (int8 K % 8 == 0, nf4 K == Kp) and the pointers are 16-byte
// aligned, the flattened weight is a plain array of units of 8 values: 4 packed nf4 bytes or 8
// int8 bytes in, one 16-byte store of fp16/bf16 (two of float) out. Lane i of a warp handles
// unit base + i, so each load and store instruction of a warp covers contiguous memory, and a
// thread keeps kDqUnroll units in flight. The 8 values of a unit share one scale (blocksize
// >= 16), looked up once. The products are the same __fmul_rn as the generic kernel, so the
// result stays bit-identical to the CPU Dequantize().
constexpr int kDqUnroll = 4;

template <bool kNf4>
struct DqUnit;
template <>
struct DqUnit<true> {
  using Type = uint32_t;  // 4 bytes = 8 nf4 values
};
template <>
struct DqUnit<false> {
  using Type = uint2;  // 8 int8 values
};

template <typename T>
__device__ __forceinline__ void StoreUnit(T* dst, const float* v) {
  __align__(16) T vals[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) vals[j] = FromFloat<T>(v[j]);
#pragma unroll
  for (int i = 0; i < 8 * int{sizeof(T)} / 16; ++i) {
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(vals)[i];
  }
}

template <typename T, bool kNf4>
__global__ void __launch_bounds__(256)
    FastDequantizeKernel(PackedWeightView w, T* out, int64_t units) {
  __shared__ float s_code[16];
  __shared__ float s_nested[256];
  LoadTables(w, s_code, s_nested);
  using U = typename DqUnit<kNf4>::Type;
  const U* src = reinterpret_cast<const U*>(w.weight);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < units;
       base += stride * kDqUnroll) {
    U in[kDqUnroll];
#pragma unroll
    for (int r = 0; r < kDqUnroll; ++r) {
      const int64_t u = base + r * stride;
      if (u < units) in[r] = __ldg(src + u);
    }
#pragma unroll
    for (int r = 0; r < kDqUnroll; ++r) {
      const int64_t u = base + r * stride;
      if (u >= units) break;
      float v[8];
      if constexpr (kNf4) {
        const float scale = BlockScale(w, s_nested, (u * 8) >> w.block_shift);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t byte = (in[r] >> (8 * j)) & 0xffu;
          v[2 * j] = __fmul_rn(s_code[byte >> 4], scale);
          v[2 * j + 1] = __fmul_rn(s_code[byte & 15], scale);
        }
      } else {
        const float scale = __fdiv_rn(w.absmax[(u * 8) / w.in_features], 127.f);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t word = j < 4 ? in[r].x : in[r].y;
          const auto q = static_cast<int8_t>((word >> (8 * (j & 3))) & 0xffu);
          v[j] = __fmul_rn(static_cast<float>(q), scale);
        }
      }
      StoreUnit(out + u * 8, v);
    }
  }
}

// x values k0 .. k0 + kValues of one row as float; zero past `valid`.
template <typename T, int kValues>
__device__ __forceinline__ void LoadX(const T* src, int valid, bool vec, float* out) {
  if (vec && valid == kValues) {
    constexpr int kPerVec = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < kValues / kPerVec; ++i) {
      __align__(16) T buf[kPerVec];
      *reinterpret_cast<uint4*>(buf) = __ldg(reinterpret_cast<const uint4*>(src) + i);
#pragma unroll
      for (int j = 0; j < kPerVec; ++j) out[i * kPerVec + j] = ToFloat(buf[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kValues; ++j) out[j] = j < valid ? ToFloat(src[j]) : 0.f;
  }
}

// Note [Fused small-M linear]
// One warp per output feature n: its lanes stride over the packed row 16 bytes at a time (so a
// warp reads 512 contiguous bytes per step), decode, multiply with kTile rows of x (read through
// L1; all warps of a block share them) and accumulate in float32; nf4 block scales are applied
// per 16-value group, the int8 row scale once at the end. A shuffle reduction finishes the dot
// products. grid = (ceil(N / 8), ceil(M / kTile)): for M <= kTile every weight byte is read once.
template <typename T, bool kNf4, int kTile>
__global__ void __launch_bounds__(kFusedWarps* kWarp)
    FusedLinearKernel(PackedWeightView w, const T* x, int64_t M, const T* bias, T* out, bool wvec,
                      bool xvec) {
  __shared__ float s_code[16];
  __shared__ float s_nested[256];
  LoadTables(w, s_code, s_nested);
  constexpr int kValues = kNf4 ? 2 * kChunkBytes : kChunkBytes;
  const int lane = threadIdx.x % kWarp;
  const int64_t n = blockIdx.x * int64_t{kFusedWarps} + threadIdx.x / kWarp;
  if (n >= w.rows) return;
  const int64_t m0 = blockIdx.y * int64_t{kTile};
  const int rows = static_cast<int>(MinI64(kTile, M - m0));
  const int64_t K = w.in_features;
  const uint8_t* wrow = w.weight + n * w.row_bytes;
  float acc[kTile];
#pragma unroll
  for (int m = 0; m < kTile; ++m) acc[m] = 0.f;

  for (int64_t b0 = lane * int64_t{kChunkBytes}; b0 < w.row_bytes; b0 += kWarp * kChunkBytes) {
    const int64_t k0 = kNf4 ? 2 * b0 : b0;
    const int valid_values = static_cast<int>(MinI64(kValues, K - k0));
    if (valid_values <= 0) continue;
    uint8_t bytes[kChunkBytes];
    LoadChunk(wrow + b0, static_cast<int>(MinI64(kChunkBytes, w.row_bytes - b0)), wvec, bytes);
    float v[kValues];
    DecodeChunk<kNf4>(bytes, s_code, v);
    float s0 = 1.f, s1 = 1.f;
    if constexpr (kNf4) ChunkScales(w, s_nested, n, k0, &s0, &s1);
#pragma unroll
    for (int m = 0; m < kTile; ++m) {
      if (m < rows) {
        float xv[kValues];
        LoadX<T, kValues>(x + (m0 + m) * K + k0, valid_values, xvec, xv);
        if constexpr (kNf4) {
          float p0 = 0.f, p1 = 0.f;
#pragma unroll
          for (int j = 0; j < 16; ++j) p0 = fmaf(v[j], xv[j], p0);
#pragma unroll
          for (int j = 16; j < 32; ++j) p1 = fmaf(v[j], xv[j], p1);
          acc[m] = fmaf(p0, s0, fmaf(p1, s1, acc[m]));
        } else {
          float p = 0.f;
#pragma unroll
          for (int j = 0; j < kValues; ++j) p = fmaf(v[j], xv[j], p);
          acc[m] += p;
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kTile; ++m) {
#pragma unroll
    for (int d = kWarp / 2; d > 0; d /= 2) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], d);
  }
  if (lane != 0) return;
  const float scale = kNf4 ? 1.f : w.absmax[n] / 127.f;
  const float b = bias != nullptr ? ToFloat(bias[n]) : 0.f;
#pragma unroll
  for (int m = 0; m < kTile; ++m) {
    if (m < rows) out[(m0 + m) * w.rows + n] = FromFloat<T>(fmaf(acc[m], scale, b));
  }
}

template <typename T>
void DequantizeAs(const PackedWeightView& w, T* out, cudaStream_t stream) {
  const bool fast = Aligned16(w.weight) && Aligned16(out) && w.in_features % 8 == 0 &&
                    (w.nf4 ? w.padded_in == w.in_features : true);
  if (fast) {
    const int64_t units = w.rows * w.in_features / 8;
    if (units == 0) return;
    const int threads = 256;
    const int sms = SmCount();
    const int64_t blocks =
        std::min<int64_t>((units + threads - 1) / threads, int64_t{sms} * 2048 / threads);
    if (w.nf4) {
      FastDequantizeKernel<T, true><<<blocks, threads, 0, stream>>>(w, out, units);
    } else {
      FastDequantizeKernel<T, false><<<blocks, threads, 0, stream>>>(w, out, units);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const bool wvec = Aligned16(w.weight) && w.row_bytes % kChunkBytes == 0;
  const bool ovec = Aligned16(out) && (w.in_features * sizeof(T)) % 16 == 0;
  const int64_t chunks = w.rows * ((w.row_bytes + kChunkBytes - 1) / kChunkBytes);
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((chunks + threads - 1) / threads, int64_t{1} << 16);
  if (blocks == 0) return;
  if (w.nf4) {
    DequantizeKernel<T, true><<<blocks, threads, 0, stream>>>(w, out, wvec, ovec);
  } else {
    DequantizeKernel<T, false><<<blocks, threads, 0, stream>>>(w, out, wvec, ovec);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kTile>
void FusedWithTile(const PackedWeightView& w, const T* x, int64_t m, const T* bias, T* out,
                   cudaStream_t stream) {
  const bool wvec = Aligned16(w.weight) && w.row_bytes % kChunkBytes == 0;
  const bool xvec = Aligned16(x) && (w.in_features * sizeof(T)) % 16 == 0;
  const dim3 grid(static_cast<unsigned>((w.rows + kFusedWarps - 1) / kFusedWarps),
                  static_cast<unsigned>((m + kTile - 1) / kTile));
  const dim3 block(kFusedWarps * kWarp);
  if (w.nf4) {
    FusedLinearKernel<T, true, kTile><<<grid, block, 0, stream>>>(w, x, m, bias, out, wvec, xvec);
  } else {
    FusedLinearKernel<T, false, kTile><<<grid, block, 0, stream>>>(w, x, m, bias, out, wvec, xvec);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void FusedAs(const PackedWeightView& w, const void* x, int64_t m, const void* bias, void* out,
             cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return;
  auto* xt = static_cast<const T*>(x);
  auto* bt = static_cast<const T*>(bias);
  auto* ot = static_cast<T*>(out);
  if (m <= 1) return FusedWithTile<T, 1>(w, xt, m, bt, ot, stream);
  if (m <= 2) return FusedWithTile<T, 2>(w, xt, m, bt, ot, stream);
  if (m <= 4) return FusedWithTile<T, 4>(w, xt, m, bt, ot, stream);
  if (m <= 8) return FusedWithTile<T, 8>(w, xt, m, bt, ot, stream);
  return FusedWithTile<T, kFusedMaxTile>(w, xt, m, bt, ot, stream);
}

}  // namespace

void LaunchDequantize(const PackedWeightView& w, void* out, ElemType type, cudaStream_t stream) {
  WithElemType(type, [&](auto t) { DequantizeAs(w, static_cast<decltype(t)*>(out), stream); });
}

void LaunchFusedLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                       void* out, ElemType type, cudaStream_t stream) {
  WithElemType(type, [&](auto t) { FusedAs<decltype(t)>(w, x, m, bias, out, stream); });
}

}  // namespace qpool::quant::cuda
