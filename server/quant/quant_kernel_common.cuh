// Helpers shared by the CUDA kernels of the quant layer (quant_linear, w8a8, rope, cat_gelu,
// geglu). Included by .cu files only; everything here is inline or internal to each translation
// unit.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

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
constexpr int kFusedWarps = 8;            // rows (output features) per block of the fused kernel
constexpr int kFusedMaxTile = 16;         // rows of x per block of the fused kernel
constexpr int kElementwiseThreads = 256;  // block size of the elementwise kernels (rope, cat_gelu)

// kValues consecutive values of one row, loaded and stored as one access. kAlign is the access's
// alignment: 16 bytes for a wide path (one vector load and store), sizeof(T) or a pair's for the
// narrow ones, which must also take views that start at any element of their storage.
template <typename T, int kValues, int kAlign>
struct alignas(kAlign) Pack {
  T v[kValues];
};

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

// ATen's exact GELU, in float32 and in ATen's order of operations (Note [GEGLU op]).
__device__ __forceinline__ float GeluErf(float x) {
  constexpr float kAlpha = 0.70710678118654752440f;  // 1 / sqrt(2)
  return x * 0.5f * (1.f + erff(x * kAlpha));
}

// One value of qpool::geglu (Note [GEGLU op]): value * gelu(gate), the GELU rounded to T before
// the product, as aten::gelu's output is, and the product taken in float32 and rounded to T.
template <typename T>
__device__ __forceinline__ T GegluValue(T value, T gate) {
  return FromFloat<T>(ToFloat(value) * ToFloat(FromFloat<T>(GeluErf(ToFloat(gate)))));
}

// Multiprocessors of the current device (host; the runtime caches the attribute).
inline int SmCount() {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

__device__ __forceinline__ int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }

__host__ __device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Host dispatch: f(T()) with T the float, fp16 or bf16 type `type` names.
template <typename F>
void WithElemType(ElemType type, F&& f) {
  switch (type) {
    case ElemType::kFloat:
      return f(float());
    case ElemType::kHalf:
      return f(__half());
    case ElemType::kBFloat16:
      return f(__nv_bfloat16());
  }
}

// Host dispatch of the tensor-core launchers: f(T()) with T the fp16/bf16 type `type` names
// (float32 is refused, naming `what`), and f(nf4, double_quant) as std::bool_constant's for the
// weight's format.
template <typename F>
void WithHalfType(ElemType type, const char* what, F&& f) {
  switch (type) {
    case ElemType::kHalf:
      return f(__half());
    case ElemType::kBFloat16:
      return f(__nv_bfloat16());
    case ElemType::kFloat:
      break;
  }
  TORCH_CHECK(false, what, ": float32 x is not supported");
}

template <typename F>
void WithFormat(const PackedWeightView& w, F&& f) {
  if (w.nf4 && w.double_quant) return f(std::true_type(), std::true_type());
  if (w.nf4) return f(std::true_type(), std::false_type());
  return f(std::false_type(), std::false_type());
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

}  // namespace
}  // namespace qpool::quant::cuda
