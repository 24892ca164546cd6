// CUDA kernel for qpool::quant_linear at small M (fp16/bf16 x, M <= kMmaMaxRows): a tensor-core
// GEMM that reads each packed weight byte once and applies it to every row of x.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "quant/quant_kernels.h"
#include "quant/quant_mma_common.cuh"

namespace qpool::quant::cuda {
namespace {

// Note [Tensor-core small-M linear]
// For fp16/bf16 x with M <= 16 the layer is bound by reading the packed weight, so the kernel is
// built to stream it with few instructions per weight byte and no second pass over anything.
// One mma.sync m16n8k16 per 16 values of k computes a 16 x 8 tile of out (rows of x x output
// features); x is A, the decoded weight B.
//
// Work split. A block of kMmaWarps warps owns 8 * kTiles consecutive output features (kTiles n8
// tiles per warp, Note [Small-M block shape]); its warps split the block's range of k between
// them (warp w takes 64-byte steps w, w + kMmaWarps, ...) and add their float32 sums through
// shared memory at the end. Lane (g, t) = (lane / 4, lane % 4) of a warp owns features
// n0 + 8 j + g (B column g of tile j) and loads 16 contiguous packed bytes of each at byte t * 16
// of a step, so a quad reads 64 contiguous bytes of a row and every weight byte is loaded once,
// with a 16-byte load that skips L1 (it is never read again). The x fragment of a step is loaded
// once (16-byte loads through L1) and serves the warp's kTiles mma's instead of one.
//
// k permutation. The sum over k does not care about the order of k, so mma step s of a chunk
// takes the lane's values 4s .. 4s + 3 (as the mma's k pairs 2t and 2t + 8) and A is loaded with
// the same permutation: lane (g, t) reads x[g][k0 .. k0 + kValues) and x[g + 8][...] as 16-byte
// vectors. For M <= 8 the rows g + 8 are zero registers and never loaded.
//
// NF4 decode (Note [NF4 byte table]): one shared-memory load per packed byte gives both of its
// values as a pair of T, which one __hmul2 scales by the byte's block absmax (rounded to T).
// int8 values are exact in T: fp16 through the 0x6400 exponent trick (a byte permute and one
// subtraction per pair), bf16 through float32; the row scale is applied at the end in float32.
// Accumulation is float32.
//
// Note [Split-k over a cluster]: gridDim.y splits k and the splits of one feature block form a
// thread-block cluster (Hopper, at most kMmaMaxSplits blocks): each block leaves its sums in
// shared memory, and after a cluster barrier every block adds one slice of the outputs from all
// the blocks' shared memory and writes it. One launch, no float workspace, no second kernel. GPUs
// without clusters (sm_80) run one split.
//
// Note [Small-M block shape]
// A call at these sizes lasts a few memory latencies, so what sets its time is how many rounds of
// blocks it takes: a block that starts in a second wave pays the whole chain again (load, table,
// steps, reduction). Measured with every shape forced (bench/quant_small_m/shapes.py: 2 or 4
// tiles x 1, 2, 4 or 8 splits, 10 layers, M = 1, 4, 8, 16, int8 / nf4 / nf4 + double quant;
// bench/results/quant_linear_small_m_shapes_h100.json):
// - Splits pay only when the blocks still fit in one wave and each split keeps many steps. The
//   earlier rule (enough splits for two blocks per multiprocessor) overshot into a second wave
//   whenever fewer than three blocks fit, and then lost to no split at all. Now: the most of 1,
//   2, 4, 8 splits whose blocks fit in one wave (resident blocks from the occupancy calculator)
//   with at least kMmaMinStepsPerSplit steps each; of the benchmark layers only Flux MLP down
//   (K = 12288) splits.
// - 4 tiles per warp where 2-tile blocks would take more than one wave (with M <= 8 on an H100:
//   nf4 from N = 4240, int8 from N = 8464), and for nf4 with M > 8 on deep layers
//   (K >= kMmaDeepK), where x (two rows per lane) is the larger stream; otherwise 2 (int8
//   decodes cheaply, so parallelism wins).
// - Blocks of several feature columns with fewer warps over k each (measured with a variant of
//   this kernel) were never clearly faster, and much slower with one warp over k, so all 8 warps
//   of a block split k.
// Side by side, the rule's shapes beat the previous rule's on geometric mean in every format,
// and the best forced shape of each case is close to the rule's. Slower than the previous rule:
// nf4 Flux MLP down at M = 8 (2-tile blocks in one split instead of two splits over more than
// one wave) and nf4 SD 1.5 feed-forward at M <= 8 (its 2-tile blocks fitted one wave only with
// three blocks per multiprocessor, which loading x ahead costs in registers).
//
// Where the time goes: most layers finish within a few memory latencies. Weights come one step
// ahead (Note [Prefetched steps]), and for M <= 8 the x fragment too. On the wide layers with
// K = 1280 (SD 1.5 and SDXL feed-forward) nf4 stays slower than fp16: a %globaltimer trace of
// every block shows each block's table fill queued behind every block's first weight loads, and
// the blocks of the second wave starting only as the first wave's finish. A
// persistent variant (one wave of blocks walking the feature blocks, the table kept, the next
// feature block's first step loaded during the reduction) was slower on geometric mean, even
// where one wave holds every block: the look-ahead's registers spill in the 4-tile kernels and
// the reduction buffer beside the table costs occupancy.
// Measured no better: prefetching x into L1 one step ahead; a ring of cp.async shared-memory
// stages that keeps several steps of weights in flight per warp (slower on most layers, faster
// only for int8 on the Flux MLP layers); and reordering the block's start: loading the NF4 code
// values before the first weights, filling the table before issuing them, or bringing the code
// values to shared memory by cp.async (even, or slower).
constexpr int kMmaWarps = 8;
constexpr int kMmaTilesFew = 2;   // n8 tiles per warp: int8, and nf4 with M <= 8
constexpr int kMmaTilesMany = 4;  // n8 tiles per warp: nf4 with M > 8
constexpr int kMmaMaxSplits = 8;  // portable cluster size
// Register budget (Note [Small-M block shape]: a block that misses the first wave costs a whole
// second round): nf4 128 per thread, two blocks per multiprocessor; int8 64 with 2 tiles per
// warp and 80 with 4, four and three blocks.
constexpr int MinBlocksPerSm(int tiles, bool nf4) { return nf4 ? 2 : (tiles == 2 ? 4 : 3); }
constexpr int kMmaMinStepsPerSplit = 32;  // steps of 64 bytes per split of k
constexpr int64_t kMmaDeepK = 3072;       // nf4 with M > 8 takes 4 tiles from this K
constexpr int kMmaMaxTiles = 4;
constexpr int kMmaMaxOutputs = kMmaMaxTiles * 4 * kWarp;  // c registers of one warp
constexpr int kMmaRedBytes = (kMmaWarps + 1) * kMmaMaxOutputs * 4;

// x values k0 .. k0 + 2 * kWords of row `src` (zero when !ok) as pairs.
template <int kWords, typename T>
__device__ __forceinline__ void LoadX(const T* src, bool ok, uint32_t* out) {
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) {
    const uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(src) + i) : make_uint4(0, 0, 0, 0);
    out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
  }
}

template <typename T, int kTiles, bool kNf4, bool kDq, bool kRows16>
__global__ void __launch_bounds__(kMmaWarps* kWarp, MinBlocksPerSm(kTiles, kNf4))
    MmaLinearKernel(PackedWeightView w, const T* x, int M, const T* bias, T* out,
                    int steps_per_split) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float s_nested[256];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  constexpr int kValues = kNf4 ? 2 * kChunkBytes : kChunkBytes;  // per lane per step
  constexpr int kMmaSteps = kValues / 4;                         // mma's per chunk
  constexpr int kFeatures = 8 * kTiles;                          // output features per block
  constexpr int kOutputs = kTiles * 4 * kWarp;                   // c registers of one warp
  // x one step ahead too, for M <= 8 (Note [Prefetched steps]); with M > 8 its registers spill.
  constexpr bool kPrefetchX = !kRows16;
  const int g = lane / 4;
  const int64_t n0 = blockIdx.x * int64_t{kFeatures};
  LaneRows<T, kTiles> lr;
  lr.t = lane % 4;
  lr.n0 = n0 + g;
  const int64_t K = w.in_features;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int64_t n = lr.n0 + 8 * j;
    lr.row_ok[j] = n < w.rows;
    lr.wrow[j] = w.weight + (lr.row_ok[j] ? n : 0) * w.row_bytes;
  }
  lr.x0_ok = g < M;
  lr.x1_ok = kRows16 && g + 8 < M;
  lr.x0 = x + (lr.x0_ok ? g : 0) * K;
  lr.x1 = x + (lr.x1_ok ? g + 8 : 0) * K;
  const int steps = static_cast<int>((w.row_bytes + kMmaStepBytes - 1) / kMmaStepBytes);
  const int step_begin = blockIdx.y * steps_per_split;
  const int step_end = min(step_begin + steps_per_split, steps);
  int step = step_begin + warp;
  Stage<kTiles, kNf4, kDq> cur, next;
  // x of a step: rows g (xa) and g + 8 (xb, M > 8 only), loaded one step ahead with the weights
  // when kPrefetchX (x_next), else at the start of the step.
  uint32_t xa[kValues / 2], xb[kValues / 2], xa_next[kPrefetchX ? kValues / 2 : 1],
      xb_next[kPrefetchX && kRows16 ? kValues / 2 : 1];
  const auto load_x = [&](int s, uint32_t* a, uint32_t* b) {
    const int k0 = (kNf4 ? 2 : 1) * (s * kMmaStepBytes + lr.t * kChunkBytes);
    const bool in_k = k0 < K;
    LoadX<kValues / 2>(lr.x0 + k0, in_k && lr.x0_ok, a);
    if constexpr (kRows16) LoadX<kValues / 2>(lr.x1 + k0, in_k && lr.x1_ok, b);
  };
#pragma unroll
  for (int i = 0; i < kValues / 2; ++i) xb[i] = 0;
  if (step < step_end) {
    LoadStage<T>(w, lr, step, cur);
    if constexpr (kPrefetchX) load_x(step, xa, xb);
  }

  float offset = 0.f;
  static_assert(kMmaWarps * kWarp == 256, "the table fill assumes 256 threads");
  if constexpr (kNf4) {
    offset = FillNf4Table<T, kDq>(w, smem, s_nested);
    __syncthreads();
  }
  const uint32_t lane_off = lane * 4;

  float c[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;

  for (; step < step_end; step += kMmaWarps) {
    const bool more = step + kMmaWarps < step_end;
    if (more) LoadStage<T>(w, lr, step + kMmaWarps, next);
    if constexpr (kPrefetchX) {
      if (more) load_x(step + kMmaWarps, xa_next, xb_next);
    } else {
      load_x(step, xa, xb);
    }
    uint32_t scale[kTiles][2];
    if constexpr (kNf4) PackScales<T>(cur, s_nested, offset, scale);
#pragma unroll
    for (int s = 0; s < kMmaSteps; ++s) {
      const uint32_t a[4] = {xa[2 * s], xb[2 * s], xa[2 * s + 1], xb[2 * s + 1]};
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const uint32_t words[4] = {cur.w[j].x, cur.w[j].y, cur.w[j].z, cur.w[j].w};
        uint32_t b[2];
        if constexpr (kNf4) {
          // Bytes 2s and 2s + 1 of the chunk; bytes 0..7 are the first 16-value group.
          const uint32_t word = words[s / 2];
          const uint32_t sc = scale[j][s < 4 ? 0 : 1];
          b[0] = MulPair<T>(Nf4Pair(smem, lane_off, word, 2 * (s % 2)), sc);
          b[1] = MulPair<T>(Nf4Pair(smem, lane_off, word, 2 * (s % 2) + 1), sc);
        } else {
          Int8Pairs<T>(words[s], b);
        }
        Mma<T>(c[j], a, b);
      }
    }
    cur = next;
    if constexpr (kPrefetchX) {
#pragma unroll
      for (int i = 0; i < kValues / 2; ++i) {
        xa[i] = xa_next[i];
        if constexpr (kRows16) xb[i] = xb_next[i];
      }
    }
  }

  // Sum the warps' partial tiles: red[warp][output], output = (j * 4 + r) * 32 + lane.
  float* red = reinterpret_cast<float*>(smem);
  float* sums = red + kMmaWarps * kOutputs;
  if constexpr (kNf4) __syncthreads();  // the table is no longer read
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp * kOutputs + (j * 4 + r) * kWarp + lane] = c[j][r];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < kOutputs; o += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kMmaWarps; ++i) sum += red[i * kOutputs + o];
    sums[o] = sum;
  }
  int rank = 0, splits = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (gridDim.y > 1) {
    rank = static_cast<int>(cluster.block_rank());
    splits = static_cast<int>(cluster.num_blocks());
    cluster.sync();
  } else {
    __syncthreads();
  }
#else
  __syncthreads();
#endif
  const int per_rank = (kOutputs + splits - 1) / splits;
  const int o_end = min(kOutputs, (rank + 1) * per_rank);
  for (int o = rank * per_rank + threadIdx.x; o < o_end; o += blockDim.x) {
    const int r = (o / kWarp) % 4, j = o / (4 * kWarp), ol = o % kWarp;
    const int m = ol / 4 + 8 * (r / 2);
    const int64_t n = n0 + 8 * j + 2 * (ol % 4) + r % 2;
    float sum = sums[o];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int p = 0; p < splits; ++p) {
      if (p != rank) sum += cluster.map_shared_rank(sums, p)[o];
    }
#endif
    if (m < M && n < w.rows) {
      const float scale = kNf4 ? 1.f : w.absmax[n] / 127.f;
      const float b = bias != nullptr ? ToFloat(bias[n]) : 0.f;
      out[m * w.rows + n] = FromFloat<T>(fmaf(sum, scale, b));
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (splits > 1) cluster.sync();  // peers may still read this block's sums
#endif
}

int64_t MmaSteps(const PackedWeightView& w) {
  return (w.row_bytes + kMmaStepBytes - 1) / kMmaStepBytes;
}

template <bool kNf4>
constexpr int SmemBytes() {
  return kNf4 ? std::max(kLutBytes, kMmaRedBytes) : kMmaRedBytes;
}

// PrepareOnce (quant_mma_common.cuh) with this kernel's own cache.
template <typename T, int kTiles, bool kNf4, bool kDq, bool kRows16>
KernelFit PrepareKernel() {
  static KernelFitCache cache;
  return PrepareOnce(MmaLinearKernel<T, kTiles, kNf4, kDq, kRows16>, SmemBytes<kNf4>(),
                     kMmaWarps * kWarp, cache);
}

// Calls f(tiles) with tiles as a std::integral_constant.
template <typename F>
void WithTiles(int tiles, F&& f) {
  if (tiles == kMmaTilesMany) return f(std::integral_constant<int, kMmaTilesMany>{});
  f(std::integral_constant<int, kMmaTilesFew>{});
}

template <typename T, bool kNf4, bool kDq, bool kRows16>
KernelFit FitOf(int tiles) {
  KernelFit fit;
  WithTiles(tiles, [&](auto tiles_c) {
    fit = PrepareKernel<T, decltype(tiles_c)::value, kNf4, kDq, kRows16>();
  });
  return fit;
}

// Note [Small-M block shape]: the tiles per warp and k splits for a layer, M and device.
template <typename T, bool kNf4, bool kDq, bool kRows16>
MmaPlan PlanRows(const PackedWeightView& w, const MmaDevice& dev) {
  MmaPlan plan;
  if (dev.shape.tiles > 0) {
    plan.tiles = dev.shape.tiles == kMmaTilesMany ? kMmaTilesMany : kMmaTilesFew;
  } else if (kNf4 && kRows16 && w.in_features >= kMmaDeepK) {
    plan.tiles = kMmaTilesMany;
  } else if (!kNf4 && kRows16) {
    plan.tiles = kMmaTilesFew;
  } else {
    const KernelFit few = FitOf<T, kNf4, kDq, kRows16>(kMmaTilesFew);
    const int64_t blocks = (w.rows + 8 * kMmaTilesFew - 1) / (8 * kMmaTilesFew);
    plan.tiles = blocks > int64_t{few.blocks_per_sm} * dev.sm_count ? kMmaTilesMany : kMmaTilesFew;
  }
  const KernelFit fit = FitOf<T, kNf4, kDq, kRows16>(plan.tiles);
  plan.blocks_per_sm = fit.blocks_per_sm;
  plan.blocks = (w.rows + 8 * plan.tiles - 1) / (8 * plan.tiles);
  plan.splits = 1;
  if (dev.clusters && fit.clusters) {
    if (dev.shape.splits > 0) {
      plan.splits = std::min(dev.shape.splits, kMmaMaxSplits);
    } else {
      const int64_t resident = int64_t{fit.blocks_per_sm} * dev.sm_count;
      for (int s = 2; s <= kMmaMaxSplits; s *= 2) {
        if (plan.blocks * s <= resident && MmaSteps(w) >= int64_t{s} * kMmaMinStepsPerSplit) {
          plan.splits = s;
        }
      }
    }
  }
  return plan;
}

template <typename T, bool kNf4, bool kDq, bool kRows16>
void LaunchRows(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
                const MmaDevice& dev, cudaStream_t stream) {
  const MmaPlan plan = PlanRows<T, kNf4, kDq, kRows16>(w, dev);
  const int64_t steps = MmaSteps(w);
  const int steps_per_split = static_cast<int>((steps + plan.splits - 1) / plan.splits);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(plan.blocks), static_cast<unsigned>(plan.splits));
  config.blockDim = dim3(kMmaWarps * kWarp);
  config.dynamicSmemBytes = SmemBytes<kNf4>();
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(plan.splits);
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = plan.splits > 1 ? 1 : 0;
  WithTiles(plan.tiles, [&](auto tiles_c) {
    constexpr int kTiles = decltype(tiles_c)::value;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, MmaLinearKernel<T, kTiles, kNf4, kDq, kRows16>, w, x,
                                      m, bias, out, steps_per_split));
  });
}

template <typename F>
void WithRows(const PackedWeightView& w, int64_t m, F&& f) {
  WithFormat(w, [&](auto nf4, auto dq) {
    if (m > 8) return f(nf4, dq, std::true_type{});
    return f(nf4, dq, std::false_type{});
  });
}

template <typename T>
void MmaAs(const PackedWeightView& w, const T* x, int64_t m, const T* bias, T* out,
           const MmaDevice& dev, cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return;
  WithRows(w, m, [&](auto nf4, auto dq, auto rows16) {
    LaunchRows<T, decltype(nf4)::value, decltype(dq)::value, decltype(rows16)::value>(
        w, x, static_cast<int>(m), bias, out, dev, stream);
  });
}

}  // namespace

MmaPlan PlanMmaLinear(const PackedWeightView& w, int64_t m, ElemType type,
                      const MmaDevice& device) {
  MmaPlan plan;
  WithHalfType(type, "PlanMmaLinear", [&](auto t) {
    using T = decltype(t);
    WithRows(w, m, [&](auto nf4, auto dq, auto rows16) {
      plan = PlanRows<T, decltype(nf4)::value, decltype(dq)::value, decltype(rows16)::value>(
          w, device);
    });
  });
  return plan;
}

bool MmaLinearSupported(const PackedWeightView& w, const void* x, int64_t m, ElemType type) {
  if (type == ElemType::kFloat || m < 1) return false;
  if (!Aligned16(w.weight) || !Aligned16(x) || w.row_bytes % kChunkBytes != 0) return false;
  if (w.nf4 && w.padded_in != w.in_features) return false;
  return (w.in_features * 2) % 16 == 0;
}

void LaunchMmaLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                     void* out, ElemType type, const MmaDevice& dev, cudaStream_t stream) {
  if (m > kMmaMaxRows) return LaunchMmaMediumLinear(w, x, m, bias, out, type, dev, stream);
  WithHalfType(type, "LaunchMmaLinear", [&](auto t) {
    using T = decltype(t);
    MmaAs(w, static_cast<const T*>(x), m, static_cast<const T*>(bias), static_cast<T*>(out), dev,
          stream);
  });
}

}  // namespace qpool::quant::cuda
