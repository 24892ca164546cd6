// The w8a8 product on Hopper (sm_90a): int8 x int8 on the warpgroup tensor cores with the
// scaling and the bias in the epilogue, so the int32 product never leaves the registers.
// Compiled for sm_90a only (server/quant/sm90/CMakeLists.txt); on other devices
// W8A8WgmmaSupported() says no and the caller multiplies through cuBLASLt.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "quant/sm90/wgmma_common.cuh"
#include "quant/sm90/wgmma_host.h"
#include "quant/sm90/wgmma_schedule.h"
#include "quant/w8a8_kernels.h"

namespace qpool::quant::cuda {
namespace {

// Note [Warpgroup-MMA W8A8 linear]
// For the quantized rows q [M, K] of x with their absolute maxima row_amax [M] (Note [Fused
// W8A8 kernels]) and a w8a8 weight w [N, K] int8 with absmax [N], one persistent kernel computes
//   out[r, c] = (acc[r, c] * (row_amax[r] / 127)) * (absmax[c] / 127) (+ bias[c]),
//   acc = q w^T in int32,
// the float operations of LaunchW8A8Epilogue, each rounded, in the same order (row_amax / 127
// comes from the quantizing kernel as row_scale, so the epilogue divides only per feature). The
// int32 sums are exact whatever the order of their products, so the output is the bytes of
// at::_int_mm followed by that epilogue, i.e. the CPU's (Note [W8A8 linear]). What it saves:
// the int32 [M, N] product's write and read (8 bytes per output against fp16's 2) and a
// launch; and the tensor cores run int8 at twice their fp16 rate.
// It is organised as the weight-only kernel (Note [Warpgroup-MMA large-M linear]) without the
// weight decode: out^T = w q^T, three warpgroups, one producer lane loading each k-block of 128
// values, q's tile (kBn rows) and the weight's (128 rows) of 128 bytes each, with TMA in the
// 128-byte swizzled layout, into a stage of a kStages-deep ring (`full` and `empty` mbarriers);
// two consumer warpgroups, 64 features each, issuing four m64nkBnk32 wgmma's per k-block with
// both operands read from shared memory through their matrix descriptors (the k32 step is 32
// bytes along a swizzled row, as fp16's k16 step is), int32 accumulators; the persistent
// schedule and its stream-K splits (Note [Stream-K schedule]) exchange int32 partial sums, whose
// sum is exact in any order. K need not be a multiple of the k-block: the tensor maps fill what
// lies past K (and past M or N) with zeros, which add nothing.
// Not L2-bound: clusters of two blocks sharing the x tile through TMA multicast (half the L2
// reads of x) ran slower on every measured layer (bench/results/README.md, "W8A8 at four
// images").
//
// Note [Epilogue operands]
// Both consumer warpgroups run the epilogue at once, so the tensor cores idle through it: on
// SDXL's feed-forward at 8192 rows it took a large share of the consumers' sampled time (Nsight
// Compute; bench/results/w8a8_epilogue_operands_h200.json). Most of that epilogue waited on
// global loads: each thread loaded 64 row scales, each behind its own address and bounds
// arithmetic, and the column scales' division waited on the absmax load. Each consumer
// thread now loads its operands when a tile starts, so the loads complete under the main loop:
// one row scale (thread i takes row m0 + i), its two features' absmax and bias. At the epilogue
// the row scales go through shared memory (a barrier of both warpgroups before the stores, so
// the previous tile's are read, and one after), and each value's row scale is a shared load at a
// constant offset. The operations on each value are unchanged, so are the bytes.
// Requirements (W8A8WgmmaSupported): fp16/bf16 out, K % 16 == 0 (TMA row strides), N % 8 == 0
// (16-byte stores of the output), 16-byte aligned q, weight and out.
constexpr int kThreads = 384;
constexpr int kKBlock = 128;  // int8 values, one 128-byte swizzled row
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
constexpr int kMaxSmem = 227 * 1024 - 1024;

template <int kBn>
struct Smem {
  static constexpr int kXBytes = kBn * kKBlock;
  static constexpr int kWBytes = 128 * kKBlock;
  static constexpr int kStageBytes = kXBytes + kWBytes;  // multiples of 1024: swizzle atoms
  static constexpr int kEpiRows = 64;
  static constexpr int kEpiStride = 64 + 8;
  static constexpr int kEpiBytes = 2 * kEpiRows * kEpiStride * 2;
  static constexpr int kBarrierBytes = 256;
  static constexpr int kRowScaleBytes = kBn * 4;  // Note [Epilogue operands]
  static constexpr int kFixed = kEpiBytes + kBarrierBytes + kRowScaleBytes + 1024;  // + alignment
  static constexpr int kMaxStages = kBn == 256 ? 4 : 8;
  static constexpr int kStages = std::min(kMaxStages, (kMaxSmem - kFixed) / kStageBytes);
  static constexpr int kBytes = kStages * kStageBytes + kFixed;
  static_assert(kStages >= 3, "shared memory too small for the pipeline");
};

using sm90::Schedule;
using sm90::SegmentCursor;

// int32 words of a block's workspace slot: the consumers' accumulators for `rows`-row tiles.
__host__ __device__ constexpr int64_t SlotWords(int rows) { return int64_t{rows / 2} * 256; }

__device__ __forceinline__ float RowScale(const float* row_scale, int64_t r, int M) {
  return r < M ? __ldg(row_scale + r) : 0.f;
}

// Note [Epilogue operands]: named barrier of the two consumer warpgroups (1 + cw are theirs
// alone, 3 is ExchangeSums').
constexpr int kRowScaleBarrier = 4;

template <typename T, int kBn>
__global__ void __launch_bounds__(kThreads, 1)
    W8A8WgmmaKernel(const __grid_constant__ CUtensorMap q_map,
                    const __grid_constant__ CUtensorMap w_map, int M, int N, const float* row_scale,
                    const float* absmax, const void* bias, bool bias_in_t, T* out, Schedule sched,
                    int* slots, int* flags) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<kBn>;
  constexpr int kStages = L::kStages;
  constexpr int kAcc = kBn / 2;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t epi_addr = smem_addr + kStages * L::kStageBytes;
  const uint32_t full_bar = epi_addr + L::kEpiBytes;  // kStages barriers of 8 bytes
  const uint32_t empty_bar = full_bar + 8 * kStages;
  const uint32_t row_scale_addr = full_bar + L::kBarrierBytes;  // kBn floats
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % kWarp;
  const int b = blockIdx.x;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(full_bar + 8 * s, 1);
      BarrierInit(empty_bar + 8 * s, 8);  // one per consumer warp
    }
    BarrierInitFence();
    TmaPrefetchDescriptor(&q_map);
    TmaPrefetchDescriptor(&w_map);
  }
  __syncthreads();

  if (wg == 0) {  // producer: one lane issues every load
    SetMaxRegistersDown<kProducerRegs>();
    if (tid != 0) return;
    SegmentCursor segments(sched, b);
    int it = 0, tile = 0, first = 0, last = 0;
    while (segments.Next(tile, first, last)) {
      int m0 = 0, n0 = 0;
      sched.TileStart(tile, kBn, m0, n0);
      for (int kb = first; kb < last; ++kb, ++it) {
        const int s = it % kStages;
        if (it >= kStages) BarrierWait(empty_bar + 8 * s, (it / kStages - 1) & 1);
        const uint32_t stage = smem_addr + s * L::kStageBytes;
        BarrierArriveExpectTx(full_bar + 8 * s, L::kStageBytes);
        TmaLoad2d(stage, &q_map, full_bar + 8 * s, kb * kKBlock, m0);
        TmaLoad2d(stage + L::kXBytes, &w_map, full_bar + 8 * s, kb * kKBlock, n0);
      }
    }
    return;
  }

  // consumers
  SetMaxRegistersUp<kConsumerRegs>();
  const int cw = wg - 1, warp = (tid / kWarp) % 4, g = lane / 4, t = lane % 4;
  const int row0 = 64 * cw + 16 * warp + g;  // the lane's features row0, row0 + 8 of the tile
  int acc[kAcc];
  const int ctid = tid - 128;  // 0..255 over both consumer warpgroups
  SegmentCursor segments(sched, b);
  int it = 0, tile = 0, first = 0, last = 0;
  while (segments.Next(tile, first, last)) {
    int m0 = 0, n0 = 0;
    sched.TileStart(tile, kBn, m0, n0);
    // Note [Epilogue operands]: loaded now, used after the main loop.
    const float my_row_scale = ctid < kBn ? RowScale(row_scale, int64_t{m0} + ctid, M) : 0.f;
    float feature_absmax[2] = {0.f, 0.f}, shift[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + row0 + 8 * h;
      if (n < N) {
        feature_absmax[h] = __ldg(absmax + n);
        if (bias != nullptr) {
          shift[h] = bias_in_t ? ToFloat(__ldg(static_cast<const T*>(bias) + n))
                               : __ldg(static_cast<const float*>(bias) + n);
        }
      }
    }
    for (int kb = first; kb < last; ++kb, ++it) {
      const int s = it % kStages;
      BarrierWait(full_bar + 8 * s, (it / kStages) & 1);
      const uint32_t stage = smem_addr + s * L::kStageBytes;
      const uint32_t w_tile = stage + L::kXBytes + cw * 64 * kKBlock;
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sm90::WgmmaSsS8<kBn>::Run(acc, SwizzledDesc(w_tile + 32 * k), SwizzledDesc(stage + 32 * k),
                                  kb > first || k > 0);
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the k-block before is done: release its stage
      if (kb > first) {
        __syncwarp();
        if (lane == 0) BarrierArrive(empty_bar + 8 * ((it - 1) % kStages));
      }
    }
    WgmmaWait<0>();
    __syncwarp();
    if (lane == 0) BarrierArrive(empty_bar + 8 * ((it - 1) % kStages));

    // Note [Stream-K schedule]: contribute, or collect the contributions, or neither (int32
    // sums: exact in any order).
    if (ExchangeSums<SlotWords(kBn)>(sched, b, tile, first, last, ctid, acc, slots, flags)) {
      continue;
    }

    // Epilogue. acc[4 c + 2 h + e]: feature row0 + 8 h, row of x 8 c + 2 t + e.
    NamedBarrier(kRowScaleBarrier, 256);  // the previous tile's row scales have been read
    if (ctid < kBn) StoreShared4(row_scale_addr + 4 * ctid, __float_as_uint(my_row_scale));
    NamedBarrier(kRowScaleBarrier, 256);
    float col_scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) col_scale[h] = __fdiv_rn(feature_absmax[h], 127.f);
    auto value = [&](int i, int h, float rs) {
      const float y = __fmul_rn(__fmul_rn(__int2float_rn(acc[i]), rs), col_scale[h]);
      return uint32_t{Bits(FromFloat<T>(bias != nullptr ? __fadd_rn(y, shift[h]) : y))};
    };
    const uint32_t chunk_addr = epi_addr + cw * L::kEpiRows * L::kEpiStride * 2;
    const T* chunk = reinterpret_cast<const T*>(smem + kStages * L::kStageBytes) +
                     cw * L::kEpiRows * L::kEpiStride;
    StoreTileTransposed<T, kBn, L::kEpiRows, L::kEpiStride>(
        chunk_addr, chunk, 1 + cw, warp, lane, tid, m0, n0 + 64 * cw, M, N, out,
        [&](int c, uint32_t(&r)[4]) {
          // Rows m0 + 8 c + 2 t + e and 8 more.
          const uint32_t rs = row_scale_addr + 4 * (8 * c + 2 * t);
          const float s0 = __uint_as_float(LoadShared4(rs));
          const float s1 = __uint_as_float(LoadShared4(rs + 4));
          const float s8 = __uint_as_float(LoadShared4(rs + 32));
          const float s9 = __uint_as_float(LoadShared4(rs + 36));
          r[0] = value(4 * c, 0, s0) | (value(4 * c + 1, 0, s1) << 16);
          r[1] = value(4 * c + 2, 1, s0) | (value(4 * c + 3, 1, s1) << 16);
          r[2] = value(4 * c + 4, 0, s8) | (value(4 * c + 5, 0, s9) << 16);
          r[3] = value(4 * c + 6, 1, s8) | (value(4 * c + 7, 1, s9) << 16);
        });
  }
#endif
}

// Note [Ping-pong W8A8 tiles]
// In W8A8WgmmaKernel both consumer warpgroups compute one tile and run its epilogue at once, so
// the tensor cores idle through every epilogue (still a sizeable share of the consumers'
// sampled time on SDXL's feed-forward at 8192 rows after Note [Epilogue operands]).
// W8A8PingPongKernel gives each consumer warpgroup tiles of its own, 128 features x 128 rows
// of x (two m64n128k32 wgmma's a k32 step: 128 int32 accumulators a thread, as before), and
// alternates them: the producer loads the block's tiles in order into one ring of 32 KB stages,
// warpgroup j % 2 computes the block's j-th tile, and a pair of named barriers lets a warpgroup
// start a main loop only once the other has issued all of its own, so each epilogue runs under the
// other warpgroup's main loop. The order also keeps the ring's parity waits sound: a warpgroup
// skips the other's k-blocks, and a wait on a stage's phase must come after the phase before it has
// completed, which the other warpgroup's waits of the tile before (all passed when it arrives)
// guarantee. The cost is L2 traffic: a 128 x 128 tile reads 1.33x the bytes per product of a
// 128 x 256 one. Data-parallel only: the ordered warpgroups have no stream-K exchange. The
// operations on each value are W8A8WgmmaKernel's, so are the bytes (GPU test). Which kernel runs:
// Note [W8A8 tile choice].
constexpr int kPingPongRows = 128;       // rows of x per warpgroup tile
constexpr int kPingPongTurnBarrier = 5;  // + cw: warpgroup cw waits there for its turn

struct PingPongSmem {
  static constexpr int kXBytes = kPingPongRows * kKBlock;
  static constexpr int kStageBytes = kXBytes + 128 * kKBlock;
  static constexpr int kEpiRows = 64;
  static constexpr int kEpiStride = 64 + 8;
  static constexpr int kEpiBytes = 2 * kEpiRows * kEpiStride * 2;
  static constexpr int kBarrierBytes = 256;
  static constexpr int kRowScaleBytes = 2 * kPingPongRows * 4;  // one set per warpgroup
  static constexpr int kFixed = kEpiBytes + kBarrierBytes + kRowScaleBytes + 1024;
  static constexpr int kStages = std::min(8, (kMaxSmem - kFixed) / kStageBytes);
  static constexpr int kBytes = kStages * kStageBytes + kFixed;
  static_assert(kStages >= 4, "shared memory too small for the pipeline");
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    W8A8PingPongKernel(const __grid_constant__ CUtensorMap q_map,
                       const __grid_constant__ CUtensorMap w_map, int M, int N,
                       const float* row_scale, const float* absmax, const void* bias,
                       bool bias_in_t, T* out, Schedule sched) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = PingPongSmem;
  constexpr int kStages = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t epi_addr = smem_addr + kStages * L::kStageBytes;
  const uint32_t full_bar = epi_addr + L::kEpiBytes;  // kStages barriers of 8 bytes
  const uint32_t empty_bar = full_bar + 8 * kStages;
  const uint32_t row_scale_addr = full_bar + L::kBarrierBytes;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % kWarp;
  const int b = blockIdx.x, k_blocks = sched.k_blocks;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(full_bar + 8 * s, 1);
      BarrierInit(empty_bar + 8 * s, 4);  // the warps of the warpgroup computing the stage's tile
    }
    BarrierInitFence();
    TmaPrefetchDescriptor(&q_map);
    TmaPrefetchDescriptor(&w_map);
  }
  __syncthreads();

  if (wg == 0) {  // producer: one lane loads the block's tiles in order
    SetMaxRegistersDown<kProducerRegs>();
    if (tid != 0) return;
    int it = 0;
    for (int tile = b; tile < sched.tiles; tile += sched.blocks) {
      int m0 = 0, n0 = 0;
      sched.TileStart(tile, kPingPongRows, m0, n0);
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        if (it >= kStages) BarrierWait(empty_bar + 8 * s, (it / kStages - 1) & 1);
        const uint32_t stage = smem_addr + s * L::kStageBytes;
        BarrierArriveExpectTx(full_bar + 8 * s, L::kStageBytes);
        TmaLoad2d(stage, &q_map, full_bar + 8 * s, kb * kKBlock, m0);
        TmaLoad2d(stage + L::kXBytes, &w_map, full_bar + 8 * s, kb * kKBlock, n0);
      }
    }
    return;
  }

  // consumers: warpgroup cw takes the block's tiles j = cw, cw + 2, ...
  SetMaxRegistersUp<kConsumerRegs>();
  const int cw = wg - 1, warp = (tid / kWarp) % 4, g = lane / 4, t = lane % 4, wtid = tid % 128;
  const int row0 = 16 * warp + g;  // the lane's features row0, row0 + 8 of each 64-feature half
  const uint32_t my_row_scales = row_scale_addr + cw * kPingPongRows * 4;
  const uint32_t chunk_addr = epi_addr + cw * L::kEpiRows * L::kEpiStride * 2;
  const T* chunk = reinterpret_cast<const T*>(smem + kStages * L::kStageBytes) +
                   cw * L::kEpiRows * L::kEpiStride;
  int acc[2][64];  // [feature half][4 c + 2 h + e]
  for (int tile = b + cw * sched.blocks, j = cw; tile < sched.tiles;
       tile += 2 * sched.blocks, j += 2) {
    int m0 = 0, n0 = 0;
    sched.TileStart(tile, kPingPongRows, m0, n0);
    // Note [Epilogue operands]: loaded now, used after the main loop.
    const float my_row_scale = RowScale(row_scale, int64_t{m0} + wtid, M);
    float feature_absmax[2][2] = {}, shift[2][2] = {};
#pragma unroll
    for (int f = 0; f < 2; ++f) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + 64 * f + row0 + 8 * h;
        if (n < N) {
          feature_absmax[f][h] = __ldg(absmax + n);
          if (bias != nullptr) {
            shift[f][h] = bias_in_t ? ToFloat(__ldg(static_cast<const T*>(bias) + n))
                                    : __ldg(static_cast<const float*>(bias) + n);
          }
        }
      }
    }
    if (j > 0) NamedBarrier(kPingPongTurnBarrier + cw, 256);  // the other's main loop is issued
    const int it0 = j * k_blocks;
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int it = it0 + kb, s = it % kStages;
      BarrierWait(full_bar + 8 * s, (it / kStages) & 1);
      const uint32_t stage = smem_addr + s * L::kStageBytes;
      const uint32_t w_tile = stage + L::kXBytes;
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          sm90::WgmmaSsS8<kPingPongRows>::Run(acc[f],
                                              SwizzledDesc(w_tile + f * 64 * kKBlock + 32 * k),
                                              SwizzledDesc(stage + 32 * k), kb > 0 || k > 0);
        }
      }
      WgmmaCommit();
      WgmmaWait<1>();  // the k-block before is done: release its stage
      if (kb > 0) {
        __syncwarp();
        if (lane == 0) BarrierArrive(empty_bar + 8 * ((it - 1) % kStages));
      }
    }
    // The other warpgroup's turn, if it has the block's next tile.
    if (tile + sched.blocks < sched.tiles) NamedBarrierArrive(kPingPongTurnBarrier + 1 - cw, 256);
    WgmmaWait<0>();
    __syncwarp();
    if (lane == 0) BarrierArrive(empty_bar + 8 * ((it0 + k_blocks - 1) % kStages));

    // Epilogue, as W8A8WgmmaKernel's. The first barrier of StoreTileTransposed orders these row
    // scales before their loads; the tile before's loads came before its last barrier.
    StoreShared4(my_row_scales + 4 * wtid, __float_as_uint(my_row_scale));
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      float col_scale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) col_scale[h] = __fdiv_rn(feature_absmax[f][h], 127.f);
      auto value = [&](int i, int h, float rs) {
        const float y = __fmul_rn(__fmul_rn(__int2float_rn(acc[f][i]), rs), col_scale[h]);
        return uint32_t{Bits(FromFloat<T>(bias != nullptr ? __fadd_rn(y, shift[f][h]) : y))};
      };
      StoreTileTransposed<T, kPingPongRows, L::kEpiRows, L::kEpiStride>(
          chunk_addr, chunk, 1 + cw, warp, lane, tid, m0, n0 + 64 * f, M, N, out,
          [&](int c, uint32_t(&r)[4]) {
            const uint32_t rs = my_row_scales + 4 * (8 * c + 2 * t);
            const float s0 = __uint_as_float(LoadShared4(rs));
            const float s1 = __uint_as_float(LoadShared4(rs + 4));
            const float s8 = __uint_as_float(LoadShared4(rs + 32));
            const float s9 = __uint_as_float(LoadShared4(rs + 36));
            r[0] = value(4 * c, 0, s0) | (value(4 * c + 1, 0, s1) << 16);
            r[1] = value(4 * c + 2, 1, s0) | (value(4 * c + 3, 1, s1) << 16);
            r[2] = value(4 * c + 4, 0, s8) | (value(4 * c + 5, 0, s9) << 16);
            r[3] = value(4 * c + 6, 1, s8) | (value(4 * c + 7, 1, s9) << 16);
          });
    }
  }
#endif
}

bool KernelsLoadable() {
  static Sm90ImageCache cache;  // Note [sm_90a image]
  return cache.Loads(reinterpret_cast<const void*>(W8A8WgmmaKernel<__half, 256>));
}

// Rows of q per output tile: the smallest of 64, 128 and 256 that holds M, 256 beyond.
int TileRows(int64_t m) { return m <= 64 ? 64 : m <= 128 ? 128 : 256; }

Schedule MakeSchedule(int64_t m, int64_t k, int64_t n, int sm_count, bool* split) {
  const int rows = TileRows(m);
  const int64_t m_tiles = (m + rows - 1) / rows, n_tiles = (n + 127) / 128;
  const int64_t tiles = m_tiles * n_tiles;
  TORCH_CHECK(tiles < (int64_t{1} << 31), "LaunchW8A8Wgmma: too many tiles");
  const int k_blocks = static_cast<int>((k + kKBlock - 1) / kKBlock);
  const bool x_in_l2 = m * k <= sm90::kRasterBandBytes;
  Schedule sched = sm90::PlanSchedule(tiles, k_blocks, sm_count, WgmmaSchedule::kAuto, x_in_l2);
  sched.raster =
      sm90::PlanRaster(static_cast<int>(m_tiles), static_cast<int>(n_tiles), int64_t{rows} * k);
  *split = sm90::SplitsTiles(sched);
  return sched;
}

template <typename T, int kBn>
void Launch(const int8_t* q, const float* row_scale, const int8_t* w, const float* absmax,
            const void* bias, bool bias_in_t, int m, int64_t k, int n, T* out, int sm_count,
            void* workspace, cudaStream_t stream) {
  using L = Smem<kBn>;
  auto kernel = W8A8WgmmaKernel<T, kBn>;
  static SmemLimit limit;
  limit.Ensure(reinterpret_cast<const void*>(kernel), L::kBytes);
  const CUtensorMap q_map = TensorMap2d(q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, m, k, kBn, kKBlock,
                                        CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap w_map = TensorMap2d(w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n, k, 128, kKBlock,
                                        CU_TENSOR_MAP_SWIZZLE_128B);
  bool split = false;
  const Schedule sched = MakeSchedule(m, k, n, sm_count, &split);
  int* slots = nullptr;
  int* flags = nullptr;
  if (split) {
    TORCH_CHECK(workspace != nullptr, "LaunchW8A8Wgmma: this shape needs a workspace");
    slots = static_cast<int*>(workspace);
    flags = slots + sched.blocks * SlotWords(kBn);
    C10_CUDA_CHECK(cudaMemsetAsync(flags, 0, sizeof(int) * sched.blocks, stream));
  }
  kernel<<<sched.blocks, kThreads, L::kBytes, stream>>>(q_map, w_map, m, n, row_scale, absmax, bias,
                                                        bias_in_t, out, sched, slots, flags);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

Schedule PingPongSchedule(int64_t m, int64_t k, int64_t n, int sm_count) {
  const int64_t m_tiles = (m + kPingPongRows - 1) / kPingPongRows, n_tiles = (n + 127) / 128;
  const int64_t tiles = m_tiles * n_tiles;
  TORCH_CHECK(tiles < (int64_t{1} << 31), "LaunchW8A8Wgmma: too many tiles");
  const int k_blocks = static_cast<int>((k + kKBlock - 1) / kKBlock);
  Schedule sched = sm90::PlanSchedule(tiles, k_blocks, sm_count, WgmmaSchedule::kDataParallel);
  sched.raster = sm90::PlanRaster(static_cast<int>(m_tiles), static_cast<int>(n_tiles),
                                  int64_t{kPingPongRows} * k);
  return sched;
}

template <typename T>
void LaunchPingPong(const int8_t* q, const float* row_scale, const int8_t* w, const float* absmax,
                    const void* bias, bool bias_in_t, int m, int64_t k, int n, T* out, int sm_count,
                    cudaStream_t stream) {
  using L = PingPongSmem;
  auto kernel = W8A8PingPongKernel<T>;
  static SmemLimit limit;
  limit.Ensure(reinterpret_cast<const void*>(kernel), L::kBytes);
  const CUtensorMap q_map = TensorMap2d(q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, m, k, kPingPongRows,
                                        kKBlock, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap w_map = TensorMap2d(w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n, k, 128, kKBlock,
                                        CU_TENSOR_MAP_SWIZZLE_128B);
  const Schedule sched = PingPongSchedule(m, k, n, sm_count);
  kernel<<<sched.blocks, kThreads, L::kBytes, stream>>>(q_map, w_map, m, n, row_scale, absmax, bias,
                                                        bias_in_t, out, sched);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Note [W8A8 tile choice]
// Per tile the two kinds do about equally well: where both fill the multiprocessors the same
// number of times, ping-pong was no faster than the shared kernel on the benchmark layers at
// 1024-32768 rows (bench/results/w8a8_ping_pong_h200.json): hiding the epilogue did not pay for
// the 128 x 128 tiles' L2 traffic. What differs is the rounds: kAuto
// estimates each kind's time as the k-blocks of its busiest block, counting a 128 x 128 tile's
// as half a 128 x 256 one's (for a stream-K schedule, a block's share plus kSplitCost), and takes
// ping-pong where that is at most 0.9 of the shared kernel's. On the measured layers those
// choices ran faster than the shared kernel (e.g. SDXL's 1280 x 1280 at 8192 rows, SD 1.5's
// 320-wide layers at 1024-4096 rows). Below 1024 rows nothing was measured and the shared
// kernel stays.
bool PingPongTiles(int64_t m, int64_t k, int64_t n, int sm_count, W8A8Tiles tiles) {
  if (tiles != W8A8Tiles::kAuto) return tiles == W8A8Tiles::kPingPong;
  if (m < 1024) return false;
  bool split = false;
  const Schedule shared = MakeSchedule(m, k, n, sm_count, &split);
  const Schedule pp = PingPongSchedule(m, k, n, sm_count);
  auto rounds = [](const Schedule& s) {
    return static_cast<double>((s.tiles + s.blocks - 1) / s.blocks) * s.k_blocks;
  };
  const double shared_cost =
      2.0 * (shared.stream_k ? static_cast<double>(shared.work) / shared.blocks + sm90::kSplitCost
                             : rounds(shared));
  return rounds(pp) <= 0.9 * shared_cost;
}

}  // namespace

bool W8A8WgmmaSupported(int64_t m, int64_t k, int64_t n, const void* q, const void* weight,
                        ElemType type) {
  if (type == ElemType::kFloat || m < 1 || k < 16 || n < 8) return false;
  if (k % 16 != 0 || n % 8 != 0 || !Aligned16(q) || !Aligned16(weight)) return false;
  if (m > (int64_t{1} << 30) || n > (int64_t{1} << 30)) return false;
  return KernelsLoadable();
}

int64_t W8A8WgmmaWorkspaceBytes(int64_t m, int64_t k, int64_t n, int sm_count, W8A8Tiles tiles) {
  if (m == 0 || n == 0 || PingPongTiles(m, k, n, sm_count, tiles)) return 0;
  bool split = false;
  const Schedule sched = MakeSchedule(m, k, n, sm_count, &split);
  if (!split) return 0;
  return sched.blocks * (SlotWords(TileRows(m)) + 1) * int64_t{sizeof(int)};
}

void LaunchW8A8Wgmma(const int8_t* q, const float* row_scale, const int8_t* weight,
                     const float* absmax, const void* bias, ElemType bias_type, int64_t m,
                     int64_t k, int64_t n, void* out, ElemType type, int sm_count, void* workspace,
                     cudaStream_t stream, W8A8Tiles tiles) {
  if (m == 0 || n == 0) return;
  TORCH_CHECK(Aligned16(out), "LaunchW8A8Wgmma: out must be 16-byte aligned");
  TORCH_CHECK(sm_count >= 1, "LaunchW8A8Wgmma: no multiprocessors");
  TORCH_CHECK(bias_type == ElemType::kFloat || bias_type == type,
              "LaunchW8A8Wgmma: the bias is float32 or of the output's type");
  WithHalfType(type, "LaunchW8A8Wgmma", [&](auto t) {
    using T = decltype(t);
    const int mi = static_cast<int>(m), ni = static_cast<int>(n);
    T* o = static_cast<T*>(out);
    if (PingPongTiles(m, k, n, sm_count, tiles)) {
      return LaunchPingPong<T>(q, row_scale, weight, absmax, bias, bias_type == type, mi, k, ni, o,
                               sm_count, stream);
    }
    switch (TileRows(m)) {
      case 64:
        return Launch<T, 64>(q, row_scale, weight, absmax, bias, bias_type == type, mi, k, ni, o,
                             sm_count, workspace, stream);
      case 128:
        return Launch<T, 128>(q, row_scale, weight, absmax, bias, bias_type == type, mi, k, ni, o,
                              sm_count, workspace, stream);
      default:
        return Launch<T, 256>(q, row_scale, weight, absmax, bias, bias_type == type, mi, k, ni, o,
                              sm_count, workspace, stream);
    }
  });
}

}  // namespace qpool::quant::cuda
