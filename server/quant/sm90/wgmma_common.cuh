// Device helpers of the sm_90a quant_linear kernels (quant_wgmma_kernels.cu): wgmma pipeline
// control, matrix descriptors, mbarriers and TMA, and the decode of packed weight rows into
// wgmma A fragments. Included by .cu files of this directory only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "quant/quant_mma_common.cuh"
#include "quant/sm90/wgmma_ops.cuh"

namespace qpool::quant::cuda {
namespace {

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Matrix descriptor of a K-major operand tile in the 128-byte swizzled layout: rows of 128 bytes,
// groups of 8 rows 1024 bytes apart, starting at shared address `addr` (1024-aligned, plus the
// k16 step's 32-byte offset).
__device__ __forceinline__ uint64_t SwizzledDesc(uint32_t addr) {
  return uint64_t{(addr & 0x3FFFF) >> 4} | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// The low and high bytes of the 16 code values as T (Note [Warpgroup-MMA large-M linear]).
struct CodeTable {
  uint32_t lo[4], hi[4];
};

template <typename T>
__device__ __forceinline__ CodeTable LoadCodeTable(const float* code) {
  CodeTable tab;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t bits = Bits(FromFloat<T>(__ldg(code + 4 * q + b)));
      lo |= (bits & 0xFF) << (8 * b);
      hi |= (bits >> 8) << (8 * b);
    }
    tab.lo[q] = lo;
    tab.hi[q] = hi;
  }
  return tab;
}

// The two pairs of T of the nibbles of `s` (low 16 bits: bytes e0, e1 of a packed row; element
// 2j is the high nibble): {code[e0 >> 4], code[e0 & 15]} and {code[e1 >> 4], code[e1 & 15]}.
__device__ __forceinline__ void Decode4(const CodeTable& tab, uint32_t s, uint32_t& p0,
                                        uint32_t& p1) {
  const uint32_t idx = s & 0x7777;
  const uint32_t m = Permute(s << 4, s, 0xD9C8);  // byte i: 0xFF where nibble i >= 8
  const uint32_t lo_a = Permute(tab.lo[0], tab.lo[1], idx);
  const uint32_t lo_b = Permute(tab.lo[2], tab.lo[3], idx);
  const uint32_t hi_a = Permute(tab.hi[0], tab.hi[1], idx);
  const uint32_t hi_b = Permute(tab.hi[2], tab.hi[3], idx);
  const uint32_t lo = (lo_a & ~m) | (lo_b & m);
  const uint32_t hi = (hi_a & ~m) | (hi_b & m);
  // value i = hi.byte i : lo.byte i; values 0..3 are the nibbles low, high of e0, low, high of e1
  p0 = Permute(lo, hi, 0x4051);
  p1 = Permute(lo, hi, 0x6273);
}

template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// 16 and 4 bytes at shared address `addr`. Explicit ld.shared: the generic loads the compiler
// emits for a pointer into the aligned dynamic shared memory take the long scoreboard.
__device__ __forceinline__ uint4 LoadShared16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LoadShared4(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// The packed bytes of a k-block that a lane decodes (Note [Warpgroup-MMA large-M linear]): its
// two rows' words (nf4: the whole 32-byte row, int8: the whole 64-byte row) and nf4 scales.
template <bool kNf4>
struct RawFragments {
  uint4 v[2][kNf4 ? 2 : 4];
  uint32_t scale[2];
};

// Loads the raw fragments of rows row0 and row0 + 8 of a stage's packed weight tile at shared
// address `w_addr` (rows of kRowBytes) and, for nf4, of its scale pairs at `scale_addr`.
template <bool kNf4>
__device__ __forceinline__ void LoadRawFragments(uint32_t w_addr, uint32_t scale_addr, int row0,
                                                 RawFragments<kNf4>& raw) {
  constexpr int kRowBytes = kNf4 ? 32 : 64;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t row = w_addr + (row0 + 8 * h) * kRowBytes;
#pragma unroll
    for (int q = 0; q < kRowBytes / 16; ++q) raw.v[h][q] = LoadShared16(row + 16 * q);
    if constexpr (kNf4) raw.scale[h] = LoadShared4(scale_addr + 4 * (row0 + 8 * h));
  }
}

// The A fragments of the four k16 steps of a k-block from a lane's raw fragments: register h
// and h + 2 of step s hold row half h; nf4 scaled by the row's scale pair, int8 unscaled.
template <typename T, bool kNf4>
__device__ __forceinline__ void DecodeFragments(const CodeTable& tab, const RawFragments<kNf4>& raw,
                                                int t, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kNf4) {
      const uint32_t sel = t | ((t + 4) << 4);  // byte t of two words
#pragma unroll
      for (int s = 0; s < 4; s += 2) {  // words 2 s .. 2 s + 3: steps s, s + 1
        const uint4 u = raw.v[h][s / 2];
        const uint32_t gw = Permute(Permute(u.x, u.y, sel), Permute(u.z, u.w, sel), 0x5410);
        uint32_t p[4];
        Decode4(tab, gw, p[0], p[1]);
        Decode4(tab, gw >> 16, p[2], p[3]);
        a[s][h] = MulPair<T>(p[0], raw.scale[h]);
        a[s][h + 2] = MulPair<T>(p[1], raw.scale[h]);
        a[s + 1][h] = MulPair<T>(p[2], raw.scale[h]);
        a[s + 1][h + 2] = MulPair<T>(p[3], raw.scale[h]);
      }
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4 u = raw.v[h][s];
        const uint32_t wa = (t & 2) ? u.y : u.x;
        const uint32_t wb = (t & 2) ? u.w : u.z;
        uint32_t pr[2];
        Int8Pairs<T>(Permute(wa, wb, (t & 1) ? 0x7632 : 0x5410), pr);
        a[s][h] = pr[0];
        a[s][h + 2] = pr[1];
      }
    }
  }
}

// mbarriers (shared::cta) and the tensor memory accelerator.
__device__ __forceinline__ void BarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void BarrierInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void BarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void BarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
// Box (c0, c1) of a 2-D tensor map into shared memory at `dst`, completing `bytes` on `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                          int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void TmaPrefetchDescriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Register budget of the warpgroup from here on (all its threads execute it).
template <int kRegs>
__device__ __forceinline__ void SetMaxRegistersDown() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegistersUp() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Barrier `id` (1..15) of `threads` threads.
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Four 8x8 tiles of 16-bit values, transposed: register i of lane (g, t) holds row g, columns
// 2 t, 2 t + 1 of tile i; lane 8 i + j gives the shared address of row j of stored tile i.
__device__ __forceinline__ void StoreMatrixT4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                              uint32_t r3) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
      "r"(r0), "r"(r1), "r"(r2), "r"(r3)
      : "memory");
}

}  // namespace
}  // namespace qpool::quant::cuda
