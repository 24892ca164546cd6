// CUDA kernel for qpool::quant_linear at large M on Hopper (sm_90a): a warp-specialized,
// persistent warpgroup-MMA GEMM that dequantizes the weight inside its tile loop, so no fp16 copy
// of the weight is ever written. Compiled for sm_90a only (server/quant/sm90/CMakeLists.txt); on
// other devices WgmmaLinearSupported() says no and callers take another path.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "quant/quant_kernels.h"
#include "quant/sm90/wgmma_common.cuh"
#include "quant/sm90/wgmma_host.h"
#include "quant/sm90/wgmma_schedule.h"

namespace qpool::quant::cuda {
namespace {

// Note [Warpgroup-MMA large-M linear]
// out[M, N] = x[M, K] w[N, K]^T is computed transposed, out^T = w x^T, so that the weight is the
// A operand of wgmma.mma_async, which Hopper takes from registers: the weight is decoded straight
// into A fragments, and x^T, the B operand, is read by the tensor cores from shared memory in the
// 128-byte swizzled layout its matrix descriptor describes. The kernel is organised the way fast
// Hopper GEMMs are:
// - Three warpgroups. One warp of the first is the producer: its lane 0 loads each k-block's x
//   tile (kBn rows x 64 values) and the block's 128 packed weight rows (nf4 32 bytes, int8 64
//   bytes each) with the tensor memory accelerator (TMA), and its 32 lanes write the 128 rows'
//   nf4 block scales, as pairs of T, computed from values they loaded one k-block earlier (double
//   quant decoded there too). All of it completes on the stage's `full` mbarrier (TMA bytes plus
//   33 arrivals). The two other warpgroups are consumers, 64 features each: they decode a
//   k-block's packed rows into A fragments, issue its four wgmma's as one group, then wait for
//   the next stage's `full` and load its packed rows and scales into registers (ld.shared), and
//   once the group of the k-block before has completed (wgmma.wait_group 1), release that stage
//   on its `empty` mbarrier, which the producer waits for before refilling it. No block-wide
//   barrier in the loop; the producer runs up to kStages k-blocks ahead (Note [Stage count]).
// - The consumers load one k-block ahead: profiled, a consumer that loaded its rows after the
//   wait for their stage spent much of its time stalled on those loads (generic loads
//   then, long scoreboard) while wgmma.wait_group 1 almost never waited, so the tensor pipe was
//   starved by the decode's latency. Loading ahead brought int8 on the Flux MLP layers close to
//   fp16 (bench/results/quant_linear_large_m_h100.md).
// - Tried and dropped: decoder warps (the producer warpgroup's three idle warps) writing the
//   decoded weight tile into shared memory for wgmma's with both operands there, the layout of
//   fp16 GEMMs. Correct, but slower on the large layers at M = 1024-4096: three warps decode
//   slower than the tensor pipe consumes (128-row tiles, half the products per decoded k-block,
//   saved far less than half the time per k-block), and the decoded slots leave int8 three
//   stages.
// - The A fragments alternate between two register sets (the k-loop is unrolled by two), so a
//   k-block is decoded while the wgmma's of the one before still read theirs; ptxas reports no
//   wgmma serialization (a conditional second step inside the loop caused one).
// - Lane (g, t) of warp w holds rows 16 w + g and 16 w + g + 8 of its warpgroup's 64 and, per
//   k16 step s, the values k = 16 s + 2 t, 2 t + 1, 2 t + 8, 2 t + 9 (the m16n8k16 A layout).
//   nf4: those are byte t of the 32-bit words 2 s and 2 s + 1 of the packed row (element 2j is the
//   high nibble); int8: half-word t % 2 of words 4 s + t / 2 and 4 s + 2 + t / 2.
// - NF4 decode: each byte t is looked up in a per-lane shared-memory table of pairs of T (Note
//   [NF4 pair table]), and the scale applied with one half2 multiply per pair, as in the other
//   kernels. int8 values are exact in T; the row scale is applied to the float sums at the end.
// - The producer warpgroup gives its registers to the consumers (setmaxnreg 40 / 232): 128
//   accumulators per thread for a 64 x 256 tile plus two fragment sets.
// - Persistent: at most one block per multiprocessor walks the output tiles (128 features x kBn
//   rows of x, tiles of x rows fastest), whole or in k-ranges (Note [Stream-K schedule]); the
//   producer loads the next segment's first stages during a segment's epilogue. The first
//   k-block of a segment overwrites the accumulators (scale-d = 0), so nothing else writes them.
// - Epilogue per consumer warpgroup, 64 rows of x at a time: the f32 sums (+ int8 row scale,
//   + bias) are converted and stored transposed into shared memory with stmatrix (the D fragment
//   layout is the transpose of out's), then written as 16-byte rows of out.
// Requirements (WgmmaLinearSupported): fp16/bf16, K % 64 == 0, N % 8 == 0, 16-byte aligned x,
// out and weight, nf4 blocks of >= 64 values without row padding (one scale per row per k-block).
constexpr int kThreads = 384;
constexpr int kKBlock = 64;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
constexpr int kMaxSmem = 227 * 1024 - 1024;  // dynamic: the limit less the static table

template <int kBn, bool kNf4>
struct Smem {
  static constexpr int kXBytes = kBn * 128;
  static constexpr int kWRowBytes = kNf4 ? 32 : 64;
  static constexpr int kWBytes = 128 * kWRowBytes;
  static constexpr int kScaleBytes = kNf4 ? 128 * 4 : 0;  // the rows' block scales as pairs of T
  static constexpr int kStageBytes = (kXBytes + kWBytes + kScaleBytes + 1023) / 1024 * 1024;
  static constexpr int kEpiRows = 64;                                // rows of x per epilogue chunk
  static constexpr int kEpiStride = 64 + 8;                          // T per row of a chunk
  static constexpr int kEpiBytes = 2 * kEpiRows * kEpiStride * 2;    // both consumer warpgroups
  static constexpr int kTableBytes = kNf4 ? kNf4PairTableBytes : 0;  // Note [NF4 pair table]
  static constexpr int kFixed = kEpiBytes + kTableBytes + 256 + 1024;  // + barriers, slack
  // Note [Stage count]: 4 stages at 256 rows measured faster than the 5 that fit (median over
  // the benchmark layers at M = 1024 and 4096; 3 stages slower again), 8 at 128 and 64 rows.
  static constexpr int kMaxStages = kBn == 256 ? 4 : 8;
  static constexpr int kStages = std::min(kMaxStages, (kMaxSmem - kFixed) / kStageBytes);
  static constexpr int kBytes = kStages * kStageBytes + kFixed;
  static_assert(kStages >= 3, "shared memory too small for the pipeline");
};

using sm90::Schedule;
using sm90::SegmentCursor;

// The workspace a schedule needs: a slot of f32 sums per block and a flag per block.
__host__ __device__ constexpr int64_t SlotFloats(int rows) {
  return int64_t{rows / 2} * 256;  // the consumers' accumulators for tiles of `rows` rows of x
}

template <typename T, int kBn, bool kNf4, bool kDq>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaLinearKernel(const __grid_constant__ CUtensorMap x_map,
                      const __grid_constant__ CUtensorMap w_map, PackedWeightView w, int M,
                      const T* bias, T* out, Schedule sched, float* slots, int* flags) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<kBn, kNf4>;
  constexpr int kStages = L::kStages;
  constexpr int kAcc = kBn / 2;
  extern __shared__ uint8_t smem_raw[];
  __shared__ float s_nested[256];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t epi_addr = smem_addr + kStages * L::kStageBytes;
  const uint32_t table_addr = epi_addr + L::kEpiBytes;
  const uint32_t full_bar = table_addr + L::kTableBytes;  // kStages barriers of 8 bytes
  const uint32_t empty_bar = full_bar + 8 * kStages;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % kWarp;
  const int64_t N = w.rows, K = w.in_features;
  const int b = blockIdx.x;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(full_bar + 8 * s, kNf4 ? 1 + kWarp : 1);  // + the scale writers' arrivals
      BarrierInit(empty_bar + 8 * s, 8);                    // one per consumer warp
    }
    BarrierInitFence();
    TmaPrefetchDescriptor(&x_map);
    TmaPrefetchDescriptor(&w_map);
  }
  if (kDq && tid < 256) s_nested[tid] = __ldg(w.nested_code + tid);
  if constexpr (kNf4) FillNf4PairTable<T>(w.code, table_addr, tid, kThreads);
  const float offset = kDq ? __ldg(w.offset) : 0.f;
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxRegistersDown<kProducerRegs>();
    if (tid >= kWarp) return;
    // Lane l computes the block scales of rows l + 32 i; the raw values of the next k-block of a
    // segment are loaded one k-block ahead, so their latency overlaps a k-block's wait for its
    // stage.
    float raw[4] = {};
    uint32_t raw_q[4] = {};
    auto fetch = [&](int n0, int kb) {  // the tile's first feature n0
      if constexpr (kNf4) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int64_t n = n0 + lane + kWarp * r;
          const int64_t blk = n < N ? (n * K + int64_t{kb} * kKBlock) >> w.block_shift : 0;
          if constexpr (kDq) {
            raw_q[r] = __ldg(w.absmax_q + blk);
            raw[r] = __ldg(w.nested_absmax + blk / 256);
          } else {
            raw[r] = __ldg(w.absmax + blk);
          }
        }
      }
    };
    SegmentCursor segments(sched, b);
    int it = 0, tile = 0, first = 0, last = 0;
    while (segments.Next(tile, first, last)) {
      int m0 = 0, n0 = 0;
      sched.TileStart(tile, kBn, m0, n0);
      fetch(n0, first);
      for (int kb = first; kb < last; ++kb, ++it) {
        uint32_t pairs[4] = {};
        if constexpr (kNf4) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float sv =
                kDq ? __fadd_rn(__fmul_rn(s_nested[raw_q[r]], raw[r]), offset) : raw[r];
            const uint32_t bits = Bits(FromFloat<T>(sv));
            pairs[r] = bits | (bits << 16);
          }
          if (kb + 1 < last) fetch(n0, kb + 1);
        }
        const int s = it % kStages;
        if (it >= kStages) BarrierWait(empty_bar + 8 * s, (it / kStages - 1) & 1);
        const uint32_t stage = smem_addr + s * L::kStageBytes;
        if (lane == 0) {
          BarrierArriveExpectTx(full_bar + 8 * s, L::kXBytes + L::kWBytes);
          TmaLoad2d(stage, &x_map, full_bar + 8 * s, kb * kKBlock, m0);
          TmaLoad2d(stage + L::kXBytes, &w_map, full_bar + 8 * s, kb * L::kWRowBytes, n0);
        }
        if constexpr (kNf4) {
          uint32_t* scales =
              reinterpret_cast<uint32_t*>(smem + s * L::kStageBytes + L::kXBytes + L::kWBytes);
#pragma unroll
          for (int r = 0; r < 4; ++r) scales[lane + kWarp * r] = pairs[r];
          BarrierArrive(full_bar + 8 * s);  // release: the scales are visible with the stage
        }
      }
    }
    return;
  }

  // consumers
  SetMaxRegistersUp<kConsumerRegs>();
  const int cw = wg - 1, warp = (tid / kWarp) % 4, g = lane / 4, t = lane % 4;
  const Nf4PairTable tab(table_addr, lane, t);
  const int row0 = 64 * cw + 16 * warp + g;  // the lane's rows row0, row0 + 8 of the block tile
  float acc[kAcc];
  uint32_t a0[4][4], a1[4][4];  // fragment sets of even and odd k-blocks

  RawFragments<kNf4> raw;

  // Waits for the stage of pipeline iteration `it` and loads the lane's raw fragments from it.
  auto fetch = [&](int it) {
    const int s = it % kStages;
    BarrierWait(full_bar + 8 * s, (it / kStages) & 1);
    const uint32_t stage = smem_addr + s * L::kStageBytes;
    LoadRawFragments<kNf4>(stage + L::kXBytes, stage + L::kXBytes + L::kWBytes, row0, raw);
  };
  // Decodes the fetched k-block kb (iteration it) of a segment starting at k-block `first` into
  // `a` and issues its wgmma's; fetches the next iteration's raw fragments while they run (when
  // there is one); then releases the stage of iteration it - 1 once its wgmma's have completed.
  auto step = [&](int it, int kb, int first, bool fetch_next, uint32_t(&a)[4][4]) {
    DecodeFragments<T, kNf4>(tab, raw, t, a);
    WgmmaFence();
    const uint32_t xs = smem_addr + (it % kStages) * L::kStageBytes;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      sm90::WgmmaRs<T, kBn>::Run(acc, a[k], SwizzledDesc(xs + 32 * k), kb > first || k > 0);
    }
    WgmmaCommit();
    if (fetch_next) fetch(it + 1);
    WgmmaWait<1>();
    if (kb > first) {
      __syncwarp();
      if (lane == 0) BarrierArrive(empty_bar + 8 * ((it - 1) % kStages));
    }
  };

  const int ctid = tid - 128;  // 0..255 over both consumer warpgroups
  SegmentCursor segments(sched, b);
  int it = 0, tile = 0, first = 0, last = 0;
  while (segments.Next(tile, first, last)) {
    int m0 = 0, n0 = 0;
    sched.TileStart(tile, kBn, m0, n0);
    fetch(it);
    int kb = first;
    for (; kb + 1 < last; kb += 2) {
      step(it++, kb, first, true, a0);
      step(it++, kb + 1, first, kb + 2 < last, a1);
    }
    if (kb < last) step(it++, kb, first, false, a0);  // inside the loop, it serializes wgmma's
    WgmmaWait<0>();
    __syncwarp();
    if (lane == 0) BarrierArrive(empty_bar + 8 * ((it - 1) % kStages));

    // Note [Stream-K schedule]: contribute, or collect the contributions, or neither.
    if (ExchangeSums<SlotFloats(kBn)>(sched, b, tile, first, last, ctid, acc, slots, flags)) {
      continue;
    }

    // Epilogue. acc[4 c + 2 h + e]: feature row0 + 8 h, row of x 8 c + 2 t + e.
    float scale[2] = {1.f, 1.f}, shift[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + row0 + 8 * h;
      if (n < N) {
        if constexpr (!kNf4) scale[h] = __ldg(w.absmax + n) / 127.f;
        if (bias != nullptr) shift[h] = ToFloat(bias[n]);
      }
    }
    auto pack = [&](int i, int h) {
      const uint32_t lo = Bits(FromFloat<T>(fmaf(acc[i], scale[h], shift[h])));
      const uint32_t hi = Bits(FromFloat<T>(fmaf(acc[i + 1], scale[h], shift[h])));
      return lo | (hi << 16);
    };
    const uint32_t chunk_addr = epi_addr + cw * L::kEpiRows * L::kEpiStride * 2;
    const T* chunk = reinterpret_cast<const T*>(smem + kStages * L::kStageBytes) +
                     cw * L::kEpiRows * L::kEpiStride;
    StoreTileTransposed<T, kBn, L::kEpiRows, L::kEpiStride>(chunk_addr, chunk, 1 + cw, warp, lane,
                                                            tid, m0, n0 + 64 * cw, M, N, out,
                                                            [&](int c, uint32_t(&r)[4]) {
                                                              r[0] = pack(4 * c, 0);
                                                              r[1] = pack(4 * c + 2, 1);
                                                              r[2] = pack(4 * c + 4, 0);
                                                              r[3] = pack(4 * c + 6, 1);
                                                            });
  }
#endif
}

// Whether this build's image of the kernels runs on the current device (Note [sm_90a image]).
bool KernelsLoadable() {
  static Sm90ImageCache cache;
  return cache.Loads(reinterpret_cast<const void*>(WgmmaLinearKernel<__half, 256, true, false>));
}

// The schedule of a launch (Note [Stream-K schedule]) and whether it splits any tile.
Schedule MakeSchedule(const PackedWeightView& w, int64_t m, const WgmmaTile& tile, bool* split) {
  const int64_t m_tiles = (m + tile.rows - 1) / tile.rows, n_tiles = (w.rows + 127) / 128;
  const int64_t tiles = m_tiles * n_tiles;
  TORCH_CHECK(tiles < (int64_t{1} << 31), "LaunchWgmmaLinear: too many tiles");
  const bool x_in_l2 = m * w.in_features * 2 <= sm90::kRasterBandBytes;
  Schedule sched = sm90::PlanSchedule(tiles, static_cast<int>(w.in_features / kKBlock),
                                      tile.sm_count, tile.schedule, x_in_l2);
  sched.raster = sm90::PlanRaster(static_cast<int>(m_tiles), static_cast<int>(n_tiles),
                                  int64_t{tile.rows} * w.in_features * 2);
  *split = sm90::SplitsTiles(sched);
  return sched;
}

template <typename T, int kBn, bool kNf4, bool kDq>
void Launch(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
            const WgmmaTile& tile, void* workspace, cudaStream_t stream) {
  using L = Smem<kBn, kNf4>;
  auto kernel = WgmmaLinearKernel<T, kBn, kNf4, kDq>;
  static SmemLimit limit;
  limit.Ensure(reinterpret_cast<const void*>(kernel), L::kBytes);
  constexpr CUtensorMapDataType kType = std::is_same_v<T, __half>
                                            ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMap x_map =
      TensorMap2d(x, kType, 2, m, w.in_features, kBn, kKBlock, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap w_map =
      TensorMap2d(w.weight, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, w.rows, w.row_bytes, 128,
                  L::kWRowBytes, CU_TENSOR_MAP_SWIZZLE_NONE);
  bool split = false;
  const Schedule sched = MakeSchedule(w, m, tile, &split);
  float* slots = nullptr;
  int* flags = nullptr;
  if (split) {
    TORCH_CHECK(workspace != nullptr, "LaunchWgmmaLinear: this shape needs a workspace");
    slots = static_cast<float*>(workspace);
    flags = reinterpret_cast<int*>(slots + sched.blocks * SlotFloats(kBn));
    C10_CUDA_CHECK(cudaMemsetAsync(flags, 0, sizeof(int) * sched.blocks, stream));
  }
  kernel<<<sched.blocks, kThreads, L::kBytes, stream>>>(x_map, w_map, w, m, bias, out, sched, slots,
                                                        flags);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kBn>
void LaunchAs(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
              const WgmmaTile& tile, void* workspace, cudaStream_t stream) {
  WithFormat(w, [&](auto nf4, auto dq) {
    Launch<T, kBn, decltype(nf4)::value, decltype(dq)::value>(w, x, m, bias, out, tile, workspace,
                                                              stream);
  });
}

template <typename T>
void LaunchTyped(const PackedWeightView& w, const void* x, int64_t m, const void* bias, void* out,
                 const WgmmaTile& tile, void* workspace, cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return;
  TORCH_CHECK(m <= (int64_t{1} << 30), "LaunchWgmmaLinear: too many rows");
  TORCH_CHECK(Aligned16(out), "LaunchWgmmaLinear: out must be 16-byte aligned");
  TORCH_CHECK(tile.sm_count >= 1, "LaunchWgmmaLinear: no multiprocessors");
  const int mi = static_cast<int>(m);
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* ot = static_cast<T*>(out);
  if (tile.rows == 256) return LaunchAs<T, 256>(w, xt, mi, bt, ot, tile, workspace, stream);
  if (tile.rows == 128) return LaunchAs<T, 128>(w, xt, mi, bt, ot, tile, workspace, stream);
  if (tile.rows == 64) return LaunchAs<T, 64>(w, xt, mi, bt, ot, tile, workspace, stream);
  TORCH_CHECK(false, "LaunchWgmmaLinear: no kernel for tiles of ", tile.rows, " rows");
}

}  // namespace

bool WgmmaLinearSupported(const PackedWeightView& w, const void* x, int64_t m, ElemType type) {
  if (type == ElemType::kFloat || m < 1) return false;
  if (w.in_features < kKBlock || w.in_features % kKBlock != 0 || w.rows % 8 != 0 || !Aligned16(x)) {
    return false;
  }
  if (!Aligned16(w.weight) || w.row_bytes % 16 != 0) return false;
  if (w.nf4 && (w.padded_in != w.in_features || w.blocksize < kKBlock)) return false;
  if (!w.nf4 && w.row_bytes != w.in_features) return false;
  return KernelsLoadable();
}

int64_t WgmmaWorkspaceBytes(const PackedWeightView& w, int64_t m, const WgmmaTile& tile) {
  if (m == 0 || w.rows == 0 || w.in_features < kKBlock) return 0;
  bool split = false;
  const Schedule sched = MakeSchedule(w, m, tile, &split);
  if (!split) return 0;
  const int64_t slot = SlotFloats(tile.rows);
  return sched.blocks * (slot * int64_t{sizeof(float)} + int64_t{sizeof(int)});
}

void LaunchWgmmaLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                       void* out, ElemType type, const WgmmaTile& tile, void* workspace,
                       cudaStream_t stream) {
  WithHalfType(type, "LaunchWgmmaLinear", [&](auto t) {
    LaunchTyped<decltype(t)>(w, x, m, bias, out, tile, workspace, stream);
  });
}

}  // namespace qpool::quant::cuda
