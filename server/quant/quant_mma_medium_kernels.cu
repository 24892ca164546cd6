// CUDA kernel for qpool::quant_linear at medium M (fp16/bf16 x, M > kMmaMaxRows; text encoders
// run M = 77 and 154): a tensor-core GEMM that decodes each packed weight fragment once per block
// and applies it to up to kMedMaxTilesM m16 tiles of x staged in shared memory.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "quant/quant_kernels.h"
#include "quant/quant_mma_common.cuh"

namespace qpool::quant::cuda {
namespace {

// Note [Tensor-core medium-M linear]
// From M = 17 on, x is reused often enough that the layer is no longer bound by the weight
// stream alone: the mma's and the x traffic count too. The kernel keeps the small-M kernel's
// weight side (Note [Tensor-core small-M linear]: lane (g, t) owns features n0 + 8 j + g, streams
// 16 bytes of each per 64-byte step one step ahead in registers, Note [Prefetched steps], decodes
// them into B fragments with the same k permutation) and changes the x side:
//
// - A block owns 8 * kTiles * kMedWarps consecutive features and a group of 16 * kMt rows of x
//   (gridDim.z groups cover M). Its warps take different features and the same k: every step,
//   the block copies the step's slice of x (16 * kMt rows x 128 nf4 / 64 int8 values) into shared
//   memory once with cp.async, kMedStages - 1 steps ahead, and every warp reads its A fragments
//   from there. Each decoded B fragment feeds kMt mma's; each A fragment kTiles.
// - Lane (g, t) needs x[row][k0 + 4 s .. k0 + 4 s + 3] of its own chunk (the k permutation), so
//   it reads two mma steps of a row as one 16-byte shared load. In a row-major stage, the 8 lanes
//   of a quarter warp would hit the same 16-byte bank group 2-4 times; the 16-byte units of a row
//   are XOR-swizzled (XUnit) so that they hit 8 different ones.
// - Rows past M and k past K are zero-filled by cp.async (source size 0); weights past the row
//   are zero registers as in the small-M kernel.
// - Split-k over a cluster as in Note [Split-k over a cluster] (gridDim.y), the splits chosen to
//   fill whole waves of one block per SM (MedSplits).
//
// Tiles of x per block (kMt): 2 (32 rows) or 5 (80 rows: M = 77 in one group, 154 in two); the
// launcher takes the one with fewer padded rows. Row groups of one feature block are adjacent
// block indices, so the second read of a weight tile comes from L2. Measured on an H100:
// bench/results/quant_linear_medium_m_h100.md.
constexpr int kMedWarps = 8;      // 256 threads: the NF4 table fill assumes it
constexpr int kMedStages = 3;     // x stages in shared memory
constexpr int kMedMaxSplits = 8;  // portable cluster size
constexpr int kMedMinStepsPerSplit = 4;
constexpr int kMedTilesSmallM = 2;  // m16 tiles of x per block, row groups of 32
constexpr int kMedTilesLargeM = 5;  // m16 tiles of x per block, row groups of 80
constexpr int kMedTilesN = 4;       // n8 tiles of features per warp

// Physical 16-byte unit of unit `u` of stage row `r` (Note [Tensor-core medium-M linear]).
template <bool kNf4>
__device__ __forceinline__ int XUnit(int r, int u) {
  return kNf4 ? u ^ (((r & 1) << 1) | ((u >> 3) & 1)) : u ^ (r & 1);
}

// int8 with one row group fits 128 registers, so two blocks per SM; the bound keeps a change in
// the decode (bf16 reached 129 registers once) from silently halving that.
template <typename T, int kMt, int kTiles, bool kNf4, bool kDq>
__global__ void __launch_bounds__(kMedWarps* kWarp, !kNf4 && kMt == kMedTilesSmallM ? 2 : 1)
    MedLinearKernel(PackedWeightView w, const T* x, int M, const T* bias, T* out,
                    int steps_per_split, int groups) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float s_nested[256];
  constexpr int kValues = kNf4 ? 2 * kChunkBytes : kChunkBytes;  // per lane per step
  constexpr int kMmaSteps = kValues / 4;                         // mma k16 steps per chunk
  constexpr int kUnits = kValues * 2 / 16;                       // 16-byte x units per lane
  constexpr int kRowBytes = 4 * kUnits * 16;                     // stage bytes per row
  constexpr int kRows = 16 * kMt;
  constexpr int kStageBytes = kRows * kRowBytes;
  constexpr int kFeatures = 8 * kTiles * kMedWarps;
  constexpr int kLut = kNf4 ? kLutBytes : 0;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t fblock = blockIdx.x / groups;
  const int64_t m0 = int64_t{blockIdx.x % groups} * kRows;
  const int64_t nw = fblock * kFeatures + warp * 8 * kTiles;  // the warp's first feature
  const int64_t K = w.in_features;

  LaneRows<T, kTiles> lr = {};
  lr.t = t;
  lr.n0 = nw + g;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int64_t n = lr.n0 + 8 * j;
    lr.row_ok[j] = n < w.rows;
    lr.wrow[j] = w.weight + (lr.row_ok[j] ? n : 0) * w.row_bytes;
  }
  const int steps = static_cast<int>((w.row_bytes + kMmaStepBytes - 1) / kMmaStepBytes);
  const int step_begin = blockIdx.y * steps_per_split;
  const int n_steps = max(0, min(step_begin + steps_per_split, steps) - step_begin);

  uint8_t* stages = smem + kLut;
  auto issue_x = [&](int i) {  // x of step step_begin + i into stage i % kMedStages
    uint8_t* dst = stages + (i % kMedStages) * kStageBytes;
    const int64_t k0 = int64_t{step_begin + i} * (4 * kValues);
    for (int idx = threadIdx.x; idx < kRows * 4 * kUnits; idx += kMedWarps * kWarp) {
      const int r = idx / (4 * kUnits), u = idx % (4 * kUnits);
      const int64_t m = m0 + r, k = k0 + u * 8;
      const bool ok = m < M && k < K;
      CpAsync16(dst + r * kRowBytes + XUnit<kNf4>(r, u) * 16, ok ? x + m * K + k : x, ok);
    }
  };

  Stage<kTiles, kNf4, kDq> cur, next;
  if (n_steps > 0) LoadStage<T>(w, lr, step_begin, cur);
#pragma unroll
  for (int i = 0; i < kMedStages - 1; ++i) {
    if (i < n_steps) issue_x(i);
    CpAsyncCommit();
  }
  float offset = 0.f;
  static_assert(kMedWarps * kWarp == 256, "the table fill assumes 256 threads");
  if constexpr (kNf4) offset = FillNf4Table<T, kDq>(w, smem, s_nested);
  const uint32_t lane_off = lane * 4;

  float c[kMt][kTiles][4];
#pragma unroll
  for (int i = 0; i < kMt; ++i) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) c[i][j][0] = c[i][j][1] = c[i][j][2] = c[i][j][3] = 0.f;
  }

  for (int it = 0; it < n_steps; ++it) {
    CpAsyncWait<kMedStages - 2>();
    __syncthreads();  // stage `it` visible to all; every warp is done with stage it - 1
    if (it + kMedStages - 1 < n_steps) issue_x(it + kMedStages - 1);
    CpAsyncCommit();
    if (it + 1 < n_steps) LoadStage<T>(w, lr, step_begin + it + 1, next);
    const uint8_t* xs = stages + (it % kMedStages) * kStageBytes;

    uint32_t scale[kTiles][2];
    if constexpr (kNf4) PackScales<T>(cur, s_nested, offset, scale);
#pragma unroll
    for (int q = 0; q < kMmaSteps / 2; ++q) {  // mma steps 2q, 2q + 1: x unit t * kUnits + q
      uint32_t b[2][kTiles][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * q + h;
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          const uint32_t words[4] = {cur.w[j].x, cur.w[j].y, cur.w[j].z, cur.w[j].w};
          if constexpr (kNf4) {
            const uint32_t word = words[s / 2];
            const uint32_t sc = scale[j][s < 4 ? 0 : 1];
            b[h][j][0] = MulPair<T>(Nf4Pair(smem, lane_off, word, 2 * (s % 2)), sc);
            b[h][j][1] = MulPair<T>(Nf4Pair(smem, lane_off, word, 2 * (s % 2) + 1), sc);
          } else {
            Int8Pairs<T>(words[s], b[h][j]);
          }
        }
      }
      const int unit = XUnit<kNf4>(g, t * kUnits + q) * 16;  // rows g + 8 h' + 16 i: same swizzle
#pragma unroll
      for (int i = 0; i < kMt; ++i) {
        const uint4 va = *reinterpret_cast<const uint4*>(xs + (16 * i + g) * kRowBytes + unit);
        const uint4 vb = *reinterpret_cast<const uint4*>(xs + (16 * i + g + 8) * kRowBytes + unit);
        const uint32_t a0[4] = {va.x, vb.x, va.y, vb.y};
        const uint32_t a1[4] = {va.z, vb.z, va.w, vb.w};
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          Mma<T>(c[i][j], a0, b[0][j]);
          Mma<T>(c[i][j], a1, b[1][j]);
        }
      }
    }
    cur = next;
  }

  // Output (m, n) of c[i][j][r] of lane (g, t): m = m0 + 16 i + g + 8 (r / 2), n = nw + 8 j +
  // 2 t + r % 2.
  auto store = [&](int64_t m, int64_t n, float sum) {
    if (m < M && n < w.rows) {
      const float scale = kNf4 ? 1.f : w.absmax[n] / 127.f;
      const float b = bias != nullptr ? ToFloat(bias[n]) : 0.f;
      out[m * w.rows + n] = FromFloat<T>(fmaf(sum, scale, b));
    }
  };
  if (gridDim.y == 1) {
#pragma unroll
    for (int i = 0; i < kMt; ++i) {
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          store(m0 + 16 * i + g + 8 * (r / 2), nw + 8 * j + 2 * t + r % 2, c[i][j][r]);
        }
      }
    }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Split-k: sums[warp][((i * kTiles + j) * 4 + r) * 32 + lane] over the stages and the table.
  constexpr int kOutputs = kMt * kTiles * 4 * kWarp;  // per warp
  CpAsyncWait<0>();
  __syncthreads();
  float* sums = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kMt; ++i) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        sums[warp * kOutputs + ((i * kTiles + j) * 4 + r) * kWarp + lane] = c[i][j][r];
      }
    }
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int splits = static_cast<int>(cluster.num_blocks());
  cluster.sync();
  constexpr int kAll = kMedWarps * kOutputs;
  const int per_rank = (kAll + splits - 1) / splits;
  const int o_end = min(kAll, (rank + 1) * per_rank);
  for (int o = rank * per_rank + threadIdx.x; o < o_end; o += kMedWarps * kWarp) {
    float sum = 0.f;
    for (int p = 0; p < splits; ++p) sum += cluster.map_shared_rank(sums, p)[o];
    const int ow = o / kOutputs, rem = o % kOutputs;
    const int ol = rem % kWarp, r = (rem / kWarp) % 4, j = (rem / (4 * kWarp)) % kTiles;
    const int i = rem / (4 * kWarp * kTiles);
    store(m0 + 16 * i + ol / 4 + 8 * (r / 2),
          fblock * kFeatures + ow * 8 * kTiles + 8 * j + 2 * (ol % 4) + r % 2, sum);
  }
  cluster.sync();  // peers may still read this block's sums
#endif
}

template <int kMt, int kTiles, bool kNf4>
constexpr int MedSmemBytes() {
  constexpr int kRowBytes = kNf4 ? 256 : 128;
  constexpr int kWork = (kNf4 ? kLutBytes : 0) + kMedStages * 16 * kMt * kRowBytes;
  constexpr int kSums = kMedWarps * kMt * kTiles * 4 * kWarp * 4;
  return kWork > kSums ? kWork : kSums;
}

// Splits of k (cluster size) for `blocks` blocks without split: the fewest that minimize
// (waves of one block per SM) x (steps per split).
int MedSplits(const PackedWeightView& w, int64_t blocks, const MmaDevice& dev) {
  if (!dev.clusters) return 1;
  const int64_t steps = (w.row_bytes + kMmaStepBytes - 1) / kMmaStepBytes;
  const int64_t most =
      std::min<int64_t>(kMedMaxSplits, std::max<int64_t>(1, steps / kMedMinStepsPerSplit));
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= most; ++s) {
    const int64_t waves = (blocks * s + dev.sm_count - 1) / dev.sm_count;
    const int64_t cost = waves * ((steps + s - 1) / s);
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

// PrepareOnce (quant_mma_common.cuh) with this kernel's own flags.
template <typename T, int kMt, int kTiles, bool kNf4, bool kDq>
bool PrepareMedKernel(int smem_bytes) {
  static KernelFitCache cache;
  return PrepareOnce(MedLinearKernel<T, kMt, kTiles, kNf4, kDq>, smem_bytes, kMedWarps * kWarp,
                     cache)
      .clusters;
}

template <typename T, int kMt, bool kNf4, bool kDq>
void LaunchMed(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
               const MmaDevice& dev, cudaStream_t stream) {
  constexpr int kTiles = kMedTilesN;
  constexpr int kFeatures = 8 * kTiles * kMedWarps;
  constexpr int smem = MedSmemBytes<kMt, kTiles, kNf4>();
  MmaDevice run_dev = dev;
  run_dev.clusters = dev.clusters && PrepareMedKernel<T, kMt, kTiles, kNf4, kDq>(smem);
  const int64_t groups = (m + 16 * kMt - 1) / (16 * kMt);
  const int64_t blocks = (w.rows + kFeatures - 1) / kFeatures * groups;
  TORCH_CHECK(blocks <= (int64_t{1} << 31) - 1, "LaunchMmaLinear: too many blocks");
  const int splits = MedSplits(w, blocks, run_dev);
  const int64_t steps = (w.row_bytes + kMmaStepBytes - 1) / kMmaStepBytes;
  const int steps_per_split = static_cast<int>((steps + splits - 1) / splits);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  config.blockDim = dim3(kMedWarps * kWarp);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(splits);
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = splits > 1 ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, MedLinearKernel<T, kMt, kTiles, kNf4, kDq>, w, x, m,
                                    bias, out, steps_per_split, static_cast<int>(groups)));
}

template <typename T, bool kNf4, bool kDq>
void MedByRows(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
               const MmaDevice& dev, cudaStream_t stream) {
  constexpr int64_t kSmall = 16 * kMedTilesSmallM, kLarge = 16 * kMedTilesLargeM;
  const int64_t padded_small = (m + kSmall - 1) / kSmall * kSmall;
  const int64_t padded_large = (m + kLarge - 1) / kLarge * kLarge;
  if (padded_large <= padded_small) {
    return LaunchMed<T, kMedTilesLargeM, kNf4, kDq>(w, x, m, bias, out, dev, stream);
  }
  return LaunchMed<T, kMedTilesSmallM, kNf4, kDq>(w, x, m, bias, out, dev, stream);
}

template <typename T>
void MedAs(const PackedWeightView& w, const T* x, int64_t m, const T* bias, T* out,
           const MmaDevice& dev, cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return;
  TORCH_CHECK(m <= (int64_t{1} << 30), "LaunchMmaLinear: too many rows");
  const int mi = static_cast<int>(m);
  WithFormat(w, [&](auto nf4, auto dq) {
    MedByRows<T, decltype(nf4)::value, decltype(dq)::value>(w, x, mi, bias, out, dev, stream);
  });
}

}  // namespace

void LaunchMmaMediumLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                           void* out, ElemType type, const MmaDevice& dev, cudaStream_t stream) {
  WithHalfType(type, "LaunchMmaMediumLinear", [&](auto t) {
    using T = decltype(t);
    MedAs(w, static_cast<const T*>(x), m, static_cast<const T*>(bias), static_cast<T*>(out), dev,
          stream);
  });
}

}  // namespace qpool::quant::cuda
