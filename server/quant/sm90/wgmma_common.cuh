// Device helpers of the sm_90a quant_linear kernels (quant_wgmma_kernels.cu): wgmma pipeline
// control, matrix descriptors, mbarriers and TMA, and the decode of packed weight rows into
// wgmma A fragments. Included by .cu files of this directory only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "quant/quant_mma_common.cuh"
#include "quant/sm90/wgmma_ops.cuh"
#include "quant/sm90/wgmma_schedule.h"

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

template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Loads of 16 and 4 bytes and a store of 16 at shared address `addr`. Explicit ld/st.shared: the
// generic accesses the compiler emits for a pointer into the aligned dynamic shared memory take
// the long scoreboard.
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

__device__ __forceinline__ void StoreShared4(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void StoreShared16(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

// Note [NF4 pair table]
// The nf4 decode of the sm_90a kernel looks each packed byte e up in a shared-memory table of
// pairs of T, (code[e >> 4], code[e & 15]) (element 2j is the high nibble), one copy per lane so
// that a warp's lookups never share a bank: entry e of lane l is the word at e * 128 + 4 l
// (32 KB). The entry's address is one byte permute (e into bits 8..15, 8 l into bits 0..7) and
// one shift. Per pair: permute, shift, load, and the scale multiply, about half the integer
// instructions of a register-table decode (16-entry prmt lookups of the low and high bytes and
// a select per half); the decode is on the consumers' critical path (Note [Warpgroup-MMA large-M
// linear]).
constexpr int kNf4PairTableBytes = 256 * 128;

// Fills the table at shared address `base` with the `threads` threads numbered `tid`.
template <typename T>
__device__ __forceinline__ void FillNf4PairTable(const float* code, uint32_t base, int tid,
                                                 int threads) {
  for (int i = tid; i < 256 * 8; i += threads) {
    const int e = i / 8;
    const uint32_t v = Bits(FromFloat<T>(__ldg(code + (e >> 4)))) |
                       (uint32_t{Bits(FromFloat<T>(__ldg(code + (e & 15))))} << 16);
    const uint32_t vv[4] = {v, v, v, v};
    StoreShared16(base + e * 128 + (i % 8) * 16, vv);
  }
}

// A lane's view of the table: its base address, its column and the byte it looks up per word.
struct Nf4PairTable {
  uint32_t base;  // shared address
  uint32_t lane8;
  uint32_t sel;  // permute selector: byte t of the word into bits 8..15, 8 lane into 0..7
  __device__ __forceinline__ Nf4PairTable(uint32_t table, int lane, int t)
      : base(table), lane8(8 * lane), sel(0x5504 | (t << 4)) {}
  // The pair of T of the lane's byte of `word`.
  __device__ __forceinline__ uint32_t Pair(uint32_t word) const {
    return LoadShared4(base + (Permute(word, lane8, sel) >> 1));
  }
};

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
__device__ __forceinline__ void DecodeFragments(const Nf4PairTable& tab,
                                                const RawFragments<kNf4>& raw, int t,
                                                uint32_t (&a)[4][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kNf4) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {  // byte t of words 2 s and 2 s + 1
        const uint4 u = raw.v[h][s / 2];
        a[s][h] = MulPair<T>(tab.Pair(s % 2 ? u.z : u.x), raw.scale[h]);
        a[s][h + 2] = MulPair<T>(tab.Pair(s % 2 ? u.w : u.y), raw.scale[h]);
      }
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4 u = raw.v[h][s];
        const uint32_t wa = (t & 2) ? u.y : u.x;
        const uint32_t wb = (t & 2) ? u.w : u.z;
        uint32_t pr[2];
        Int8HalfPairs<T>(wa, wb, t & 1, pr);
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
// Arrives at barrier `id` of `threads` threads without waiting (the others bar.sync on it).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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

__device__ __forceinline__ void StoreRelease(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int LoadAcquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Note [Stream-K schedule] in a consumer warpgroup pair (thread ctid of 256), after a segment
// [first, last) of `tile`: a contribution stores the accumulators in block b's workspace slot
// (kSlotWords words per block) and sets its flag, and the caller skips the epilogue (true); an
// owner that stops early adds the slots of the blocks after it that contribute to its tile, in
// block order (false).
template <int64_t kSlotWords, int kAcc, typename A>
__device__ __forceinline__ bool ExchangeSums(const sm90::Schedule& sched, int b, int tile,
                                             int first, int last, int ctid, A (&acc)[kAcc],
                                             A* slots, int* flags) {
  if (first > 0) {
    A* slot = slots + b * kSlotWords + ctid;
#pragma unroll
    for (int q = 0; q < kAcc; ++q) __stcg(slot + q * 256, acc[q]);
    // The barrier orders every consumer's stores before thread 0's release, which is cumulative:
    // one gpu-scope release instead of a fence per thread.
    NamedBarrier(3, 256);
    if (ctid == 0) StoreRelease(flags + b, 1);
    return true;
  }
  if (last < sched.k_blocks) {
    const int64_t tile_end = int64_t{tile + 1} * sched.k_blocks;
    for (int c = b + 1; sched.Contributes(c, tile_end); ++c) {
      if (ctid == 0) {
        while (LoadAcquire(flags + c) == 0) {
        }
      }
      NamedBarrier(3, 256);
      const A* slot = slots + c * kSlotWords + ctid;
#pragma unroll
      for (int q = 0; q < kAcc; ++q) acc[q] += __ldcg(slot + q * 256);
    }
  }
  return false;
}

// The epilogue's store of a consumer warpgroup's 64 features n_first.. x kBn rows of x from m0:
// its D fragments (feature rows, the transpose of out's) go through its shared-memory chunk of
// kEpiRows rows of kEpiStride T at `chunk_addr` (`chunk` the same bytes) with stmatrix, kEpiRows
// rows of out at a time, then to out [M, N] as 16-byte rows; named barrier `barrier` is the
// warpgroup's alone. `fragments(c, r)` gives the stmatrix registers of
// row groups c and c + 1 (c even): r[0], r[1] features row0 and row0 + 8 of rows 8 c + 2 t + e,
// r[2], r[3] the same of rows 8 (c + 1) + 2 t + e, as pairs of T (e = 0 low).
template <typename T, int kBn, int kEpiRows, int kEpiStride, typename Fragments>
__device__ __forceinline__ void StoreTileTransposed(uint32_t chunk_addr, const T* chunk,
                                                    int barrier, int warp, int lane, int tid,
                                                    int m0, int n_first, int M, int64_t N, T* out,
                                                    Fragments&& fragments) {
  const int j = lane / 8, i8 = lane % 8;  // stmatrix: lane gives row i8 of tile j
  const uint32_t lane_addr =
      chunk_addr + ((8 * (j / 2) + i8) * kEpiStride + 16 * warp + 8 * (j % 2)) * 2;
#pragma unroll
  for (int q = 0; q < kBn / kEpiRows; ++q) {
    NamedBarrier(barrier, 128);  // the chunk before has been read
#pragma unroll
    for (int c = 8 * q; c < 8 * q + 8; c += 2) {
      uint32_t r[4];
      fragments(c, r);
      StoreMatrixT4(lane_addr + (c - 8 * q) * 8 * kEpiStride * 2, r[0], r[1], r[2], r[3]);
    }
    NamedBarrier(barrier, 128);
#pragma unroll
    for (int v = tid % 128; v < kEpiRows * 8; v += 128) {
      const int rr = v / 8, c8 = v % 8;
      const int64_t m = m0 + kEpiRows * q + rr, n = n_first + 8 * c8;
      if (m < M && n < N) {
        *reinterpret_cast<uint4*>(out + m * N + n) =
            *reinterpret_cast<const uint4*>(chunk + rr * kEpiStride + 8 * c8);
      }
    }
  }
}

}  // namespace
}  // namespace qpool::quant::cuda
