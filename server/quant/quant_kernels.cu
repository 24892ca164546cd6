// CUDA kernels for qpool::quant_linear: dequantize int8/nf4 into a workspace (large M, followed
// by cuBLAS) and a fused small-M linear that reads the packed weights once.
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {
namespace {

// Note [Kernel work unit]
// Both kernels walk a packed row in chunks of 16 bytes (one uint4 load): 16 int8 values or 32
// nf4 values. Chunks start at multiples of 16 bytes, so an nf4 chunk covers two groups of 16
// values and, blocksize being a power of two >= 16, each group lies in one block: two scale
// look-ups per chunk. A chunk that is short (row end) or unaligned is read byte by byte.
constexpr int kChunkBytes = 16;
constexpr int kWarp = 32;
constexpr int kFusedWarps = 8;     // rows (output features) per block of the fused kernel
constexpr int kFusedMaxTile = 16;  // rows of x per block of the fused kernel

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }

__host__ __device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Code tables in shared memory; every thread of the block must call it.
__device__ __forceinline__ void LoadTables(const PackedWeightView& w, float* s_code,
                                           float* s_nested) {
  if (w.nf4) {
    for (int i = threadIdx.x; i < 16; i += blockDim.x) s_code[i] = w.code[i];
    if (w.double_quant) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) s_nested[i] = w.nested_code[i];
    }
  }
  __syncthreads();
}

// Float32 absmax of nf4 block `b`; the double-quant formula avoids FMA contraction to match the
// CPU's separate multiply and add.
__device__ __forceinline__ float BlockScale(const PackedWeightView& w, const float* s_nested,
                                            int64_t b) {
  if (!w.double_quant) return w.absmax[b];
  return __fadd_rn(__fmul_rn(s_nested[w.absmax_q[b]], w.nested_absmax[b / 256]), *w.offset);
}

// Loads the 16 bytes at `src` (fewer when `valid` < 16; the rest are zero).
__device__ __forceinline__ void LoadChunk(const uint8_t* src, int valid, bool vec, uint8_t* out) {
  if (vec && valid == kChunkBytes) {
    *reinterpret_cast<uint4*>(out) = __ldg(reinterpret_cast<const uint4*>(src));
  } else {
#pragma unroll
    for (int j = 0; j < kChunkBytes; ++j) out[j] = j < valid ? src[j] : 0;
  }
}

// Values of a chunk before scaling: int8 as float, nf4 as code values.
template <bool kNf4>
__device__ __forceinline__ void DecodeChunk(const uint8_t* bytes, const float* s_code, float* v) {
#pragma unroll
  for (int j = 0; j < kChunkBytes; ++j) {
    if constexpr (kNf4) {
      v[2 * j] = s_code[bytes[j] >> 4];
      v[2 * j + 1] = s_code[bytes[j] & 15];
    } else {
      v[j] = static_cast<float>(static_cast<int8_t>(bytes[j]));
    }
  }
}

// Scales of the two 16-value groups of the nf4 chunk at value `k0` of row `n` (0 past the row).
__device__ __forceinline__ void ChunkScales(const PackedWeightView& w, const float* s_nested,
                                            int64_t n, int64_t k0, float* s0, float* s1) {
  const int64_t base = n * w.padded_in + k0;
  *s0 = BlockScale(w, s_nested, base / w.blocksize);
  *s1 = k0 + 16 < w.padded_in ? BlockScale(w, s_nested, (base + 16) / w.blocksize) : 0.f;
}

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
  switch (type) {
    case ElemType::kFloat:
      return DequantizeAs(w, static_cast<float*>(out), stream);
    case ElemType::kHalf:
      return DequantizeAs(w, static_cast<__half*>(out), stream);
    case ElemType::kBFloat16:
      return DequantizeAs(w, static_cast<__nv_bfloat16*>(out), stream);
  }
}

void LaunchFusedLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                       void* out, ElemType type, cudaStream_t stream) {
  switch (type) {
    case ElemType::kFloat:
      return FusedAs<float>(w, x, m, bias, out, stream);
    case ElemType::kHalf:
      return FusedAs<__half>(w, x, m, bias, out, stream);
    case ElemType::kBFloat16:
      return FusedAs<__nv_bfloat16>(w, x, m, bias, out, stream);
  }
}

}  // namespace qpool::quant::cuda
