// Device helpers of the tensor-core quant_linear kernels (quant_mma_kernels.cu for M <= 16,
// quant_mma_medium_kernels.cu for larger M): mma wrappers, weight decode and the prefetched weight steps.
// Included by .cu files only; everything here is inline or internal to each translation unit.
#pragma once

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <atomic>

#include "quant/int8_bf16.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

constexpr int kMmaStepBytes = 64;  // packed bytes per quad per step
constexpr int kLutStride = 256;
constexpr int kLutBytes = 256 * kLutStride;
constexpr int kNestedBlock = 256;  // absmax values per nested absmax

// Note [NF4 byte table]
// The table maps a packed byte e to the pair (code[e >> 4], code[e & 15]) as bits of T (element
// 2j is the high nibble). Random bytes of a warp would hit the same bank often, so the table is
// stored once per lane: entry e of lane l is the word at byte e * 256 + l * 4, so every lane reads
// its own bank. The entry stride of 256 bytes (half of it unused) makes the address of byte j of
// a word one byte permute (byte j into bits 8..15, the lane offset into bits 0..7). 64 KB of
// dynamic shared memory per block, filled once per block while the first weights are loading.
// (A 16-entry table read once per nibble is conflict-free too but costs two loads per byte.)

template <typename T>
struct Pair;
template <>
struct Pair<__half> {
  using Type = __half2;
};
template <>
struct Pair<__nv_bfloat16> {
  using Type = __nv_bfloat162;
};

template <typename T>
__device__ __forceinline__ uint16_t Bits(T v) {
  return *reinterpret_cast<const uint16_t*>(&v);
}

template <typename T>
__device__ __forceinline__ uint32_t MulPair(uint32_t a, uint32_t b) {
  using P = typename Pair<T>::Type;
  P r = __hmul2(*reinterpret_cast<const P*>(&a), *reinterpret_cast<const P*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t Permute(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// 16 bytes of a weight row, streamed (not kept in L1).
__device__ __forceinline__ uint4 LoadStream(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ void Mma(float* c, const uint32_t* a, const uint32_t* b);
template <>
__device__ __forceinline__ void Mma<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float* c, const uint32_t* a,
                                                   const uint32_t* b) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Values 4s .. 4s + 3 of a 16-byte int8 chunk (word s) as two pairs of T.
template <typename T>
__device__ __forceinline__ void Int8Pairs(uint32_t word, uint32_t* b);
template <>
__device__ __forceinline__ void Int8Pairs<__half>(uint32_t word, uint32_t* b) {
  // 0x6400 | (q + 128) is the half 1024 + q + 128, exact; subtracting 1152 leaves q.
  const uint32_t u = word ^ 0x80808080u;
  const __half2 bias = __half2half2(__ushort_as_half(0x6480));  // 1152
  const uint32_t lo_bits = Permute(u, 0x64646464u, 0x5140);  // bytes 0, 1
  const uint32_t hi_bits = Permute(u, 0x64646464u, 0x5342);  // bytes 2, 3
  const __half2 lo = __hsub2(*reinterpret_cast<const __half2*>(&lo_bits), bias);
  const __half2 hi = __hsub2(*reinterpret_cast<const __half2*>(&hi_bits), bias);
  b[0] = *reinterpret_cast<const uint32_t*>(&lo);
  b[1] = *reinterpret_cast<const uint32_t*>(&hi);
}
// Note [Exact int8 to bf16] in int8_bf16.h.
template <>
__device__ __forceinline__ void Int8Pairs<__nv_bfloat16>(uint32_t word, uint32_t* b) {
  b[0] = Int8PairBf16(Permute(word, 0x43434343u, 0x5140));  // bytes 0, 1
  b[1] = Int8PairBf16(Permute(word, 0x43434343u, 0x5342));  // bytes 2, 3
}

// Int8Pairs of the word made of half-word `half` (0 or 1) of wa and the same half of wb: pair 0
// from wa, pair 1 from wb. bf16 takes the bytes straight from wa and wb (no gather).
template <typename T>
__device__ __forceinline__ void Int8HalfPairs(uint32_t wa, uint32_t wb, int half, uint32_t* b) {
  Int8Pairs<T>(Permute(wa, wb, half ? 0x7632 : 0x5410), b);
}
template <>
__device__ __forceinline__ void Int8HalfPairs<__nv_bfloat16>(uint32_t wa, uint32_t wb, int half,
                                                            uint32_t* b) {
  const uint32_t sel = half ? 0x5342 : 0x5140;
  b[0] = Int8PairBf16(Permute(wa, 0x43434343u, sel));
  b[1] = Int8PairBf16(Permute(wb, 0x43434343u, sel));
}

// Pair of T of nf4 byte j (0..3) of `word` from the lane's column of the byte table `lut`.
__device__ __forceinline__ uint32_t Nf4Pair(const uint8_t* lut, uint32_t lane_off, uint32_t word,
                                            int j) {
  return *reinterpret_cast<const uint32_t*>(lut + Permute(word, lane_off, 0x5504 | (j << 4)));
}

// Note [Prefetched steps]
// A warp's steps are serial, so each step's weight chunks and nf4 block scales are loaded one
// step ahead into a second Stage in registers, and the first step's before the byte table is
// filled: the memory latency overlaps the previous step's decode and mma's instead of adding to
// it. The scale loads are unconditional (index 0 for chunks outside the layer, whose x is zero)
// so that they do not wait on one another. 128 registers per thread keep two blocks per SM.
template <int kTiles, bool kNf4, bool kDq>
struct Stage {
  uint4 w[kTiles];
  uint32_t sq[kTiles][kNf4 ? 2 : 1];  // nf4: absmax bits, or the double-quant code index
  float sn[kTiles][kDq ? 2 : 1];      // nf4 double quant: the nested absmax
};

// Fixed per-lane inputs of the step loop.
template <typename T, int kTiles>
struct LaneRows {
  const uint8_t* wrow[kTiles];
  bool row_ok[kTiles];
  const T* x0;
  const T* x1;
  bool x0_ok, x1_ok;
  int64_t n0;  // first feature of the lane's tile 0 (n0 + g)
  int t;
};

// Asynchronous copies global -> shared (`cp.async`): a 16-byte unit, or 4 bytes; a source size of
// 0 (`valid` false) zero-fills the destination without reading.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  CpAsync16(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, valid);
}
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <typename T, int kTiles, bool kNf4, bool kDq>
__device__ __forceinline__ void LoadStage(const PackedWeightView& w, const LaneRows<T, kTiles>& lr,
                                          int step, Stage<kTiles, kNf4, kDq>& st) {
  const int b0 = step * kMmaStepBytes + lr.t * kChunkBytes;
  const bool in_k = b0 < w.row_bytes;
  const int k0 = kNf4 ? 2 * b0 : b0;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    st.w[j] = in_k && lr.row_ok[j] ? LoadStream(lr.wrow[j] + b0) : make_uint4(0, 0, 0, 0);
  }
  if constexpr (kNf4) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const bool ok = in_k && lr.row_ok[j];
      const int64_t v0 = (lr.n0 + 8 * j) * w.padded_in + k0;
      const int64_t b[2] = {ok ? v0 >> w.block_shift : 0, ok ? (v0 + 16) >> w.block_shift : 0};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && w.block_shift >= 5) {  // blocks of >= 32 values: one scale per chunk
          st.sq[j][1] = st.sq[j][0];
          if constexpr (kDq) st.sn[j][1] = st.sn[j][0];
        } else if constexpr (kDq) {
          st.sq[j][h] = __ldg(w.absmax_q + b[h]);
          st.sn[j][h] = __ldg(w.nested_absmax + b[h] / kNestedBlock);
        } else {
          st.sq[j][h] = __float_as_uint(__ldg(w.absmax + b[h]));
        }
      }
    }
  }
}


// Fills the per-lane NF4 byte table (Note [NF4 byte table]) at `lut` (kLutBytes) and, for double
// quant, the nested code table `s_nested` [256]; returns the double-quant offset (0 otherwise).
// Every thread of a 256-thread block must call it; the caller synchronizes before reading.
template <typename T, bool kDq>
__device__ __forceinline__ float FillNf4Table(const PackedWeightView& w, uint8_t* lut,
                                              float* s_nested) {
  // Thread i writes 4 lanes' copies of entries e = i / 8 + 32 r with 16-byte stores; the code
  // values are loaded first, all at once.
  float offset = 0.f;
  const int e0 = threadIdx.x / 8;
  const float lo = __ldg(w.code + (e0 & 15));
  float hi[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) hi[r] = __ldg(w.code + (e0 >> 4) + 2 * r);
  if constexpr (kDq) {
    s_nested[threadIdx.x] = __ldg(w.nested_code + threadIdx.x);
    offset = __ldg(w.offset);
  }
  const uint32_t lo_bits = uint32_t{Bits(FromFloat<T>(lo))} << 16;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const uint32_t v = Bits(FromFloat<T>(hi[r])) | lo_bits;
    *reinterpret_cast<uint4*>(lut + (e0 + 32 * r) * kLutStride + (threadIdx.x % 8) * 16) =
        make_uint4(v, v, v, v);
  }
  return offset;
}

// The stage's nf4 block scales as pairs of T (both halves the same), per tile and half chunk.
template <typename T, int kTiles, bool kDq>
__device__ __forceinline__ void PackScales(const Stage<kTiles, true, kDq>& cur,
                                           const float* s_nested, float offset,
                                           uint32_t (&scale)[kTiles][2]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sv;
      if constexpr (kDq) {
        sv = __fadd_rn(__fmul_rn(s_nested[cur.sq[j][h]], cur.sn[j][h]), offset);
      } else {
        sv = __uint_as_float(cur.sq[j][h]);
      }
      const uint32_t bits = Bits(FromFloat<T>(sv));
      scale[j][h] = bits | (bits << 16);
    }
  }
}

// What PrepareOnce learns of a kernel on a device: whether the code the device runs has the
// cluster reduction (compiled for compute_90 or later; code JIT-compiled on a Hopper GPU from
// compute_80 PTX has not, and must run one split), and how many of its blocks stay resident on
// a multiprocessor (the occupancy calculator).
struct KernelFit {
  bool clusters = false;
  int blocks_per_sm = 1;
};

// One kernel's KernelFit per device (device % 64): 0 until PrepareOnce fills it, then
// blocks_per_sm * 2 + clusters.
struct KernelFitCache {
  std::atomic<int> packed[64] = {};
};

// Raises `kernel`'s dynamic shared-memory limit to `smem_bytes` and asks for its KernelFit with
// blocks of `threads`, once per device; later calls read `cache`. Host code.
template <typename Kernel>
KernelFit PrepareOnce(Kernel kernel, int smem_bytes, int threads, KernelFitCache& cache) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& slot = cache.packed[device % 64];
  int packed = slot.load(std::memory_order_acquire);
  if (packed == 0) {
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    int blocks = 0;
    C10_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem_bytes));
    packed = std::max(blocks, 1) * 2 + (attributes.ptxVersion >= 90 ? 1 : 0);
    slot.store(packed, std::memory_order_release);
  }
  return KernelFit{(packed & 1) != 0, packed >> 1};
}

}  // namespace
}  // namespace qpool::quant::cuda
