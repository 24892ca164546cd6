// CUDA kernel for qpool::quant_linear at large M on Hopper (sm_90a): a warpgroup-MMA GEMM that
// dequantizes the weight inside its tile loop, so no fp16 copy of the weight is ever written.
// Compiled for sm_90a only (server/quant/sm90/CMakeLists.txt); on other devices
// WgmmaLinearSupported() says no and callers take another path.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>

#include "quant/quant_kernels.h"
#include "quant/quant_mma_common.cuh"
#include "quant/sm90/wgmma_ops.cuh"

namespace qpool::quant::cuda {
namespace {

// Note [Warpgroup-MMA large-M linear]
// out[M, N] = x[M, K] w[N, K]^T is computed transposed, out^T = w x^T, so that the weight is the
// A operand of wgmma.mma_async, which Hopper takes from registers: the weight is decoded straight
// into A fragments and x^T, the B operand, is read by the tensor cores from shared memory.
//
// - A block has two warpgroups and owns 128 consecutive features (64 per warpgroup, one m64
//   tile) and kBn consecutive rows of x (the wgmma N). It walks K in blocks of 64 values; every
//   k-block's x tile (kBn rows x 128 bytes, in the 128-byte swizzled layout the wgmma descriptor
//   describes), the block's 128 packed weight rows (nf4 32 bytes, int8 64 bytes each) and their
//   nf4 block scales are copied into a shared-memory stage with cp.async, kStages - 1 k-blocks
//   ahead.
// - Lane (g, t) of warp w holds rows 16 w + g and 16 w + g + 8 of its warpgroup's tile and, per
//   k16 step s, the values k = 16 s + 2 t, 2 t + 1, 2 t + 8, 2 t + 9 (the m16n8k16 A layout).
//   nf4: those are byte t of the 32-bit words 2 s and 2 s + 1 of the packed row (element 2j is the
//   high nibble); int8: half-word t % 2 of words 4 s + t / 2 and 4 s + 2 + t / 2.
// - NF4 decode without a shared-memory table: the 16 code values (as T) are split into low and
//   high bytes held in 8 registers, and `prmt` looks up four nibbles at once in each half of the
//   table (Decode4); the bit 3 of each nibble picks the half. The scale is applied with one
//   half2 multiply per pair, as in the other kernels. int8 values are exact in T; the row scale
//   is applied to the float sums at the end.
// - One barrier per k-block: after it, every warpgroup has waited for its previous k-block's
//   wgmma's, so that stage is free for the next copy. Two blocks per SM (kBn = 128) or one with
//   deeper tiles (kBn = 256) keep the tensor cores busy while a warpgroup decodes.
// - The f32 sums are converted (+ int8 scale, + bias) into a shared-memory tile [kBn][128] and
//   written out as 16-byte rows of out.
// Requirements (WgmmaLinearSupported): fp16/bf16, K % 64 == 0, N % 8 == 0, 16-byte aligned x and
// out, nf4 blocks of >= 64 values without row padding (one scale per row per k-block).
constexpr int kThreads = 256;
constexpr int kKBlock = 64;  // k values per stage
constexpr int kStages = 5;

template <int kTiles, int kBn, bool kNf4>
struct Smem {
  static constexpr int kBlockRows = 128 * kTiles;  // features (output columns) per block
  static constexpr int kXBytes = kBn * 128;
  static constexpr int kWRowBytes = kNf4 ? 32 : 64;
  static constexpr int kWStride = kWRowBytes + 16;  // padding: conflict-free 16-byte reads
  static constexpr int kWBytes = kBlockRows * kWStride;
  static constexpr int kScaleBytes = kNf4 ? kBlockRows * 8 : 0;
  static constexpr int kStageBytes = (kXBytes + kWBytes + kScaleBytes + 1023) / 1024 * 1024;
  static constexpr int kOutStride = kBlockRows + 8;            // T per row of the output tile
  static constexpr int kBytes = kStages * kStageBytes + 1024;  // + alignment slack
};

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of `r` across the asynchronous wgmma's.
__device__ __forceinline__ void FenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

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

template <typename T, int kTiles, int kBn, bool kNf4, bool kDq>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaLinearKernel(PackedWeightView w, const T* __restrict__ x, int M, const T* bias, T* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<kTiles, kBn, kNf4>;
  constexpr int kBlockRows = L::kBlockRows;
  constexpr int kAcc = kBn / 2;
  extern __shared__ uint8_t smem_raw[];
  __shared__ float s_nested[256];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x;
  const int lane = tid % kWarp, warp = (tid / kWarp) % 4, wg = tid / 128;
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t{blockIdx.x} * kBlockRows;
  const int64_t m0 = int64_t{blockIdx.y} * kBn;
  const int64_t N = w.rows, K = w.in_features;
  const int k_blocks = static_cast<int>(K / kKBlock);

  // Per-thread parts of the copies, fixed over k: chunk i of the x tile is row xr + 32 i, 16-byte
  // unit xc (swizzled by the row, and xr + 32 i has the same row & 7); weight chunk i is row
  // wr + i * kWRowsPerPass, unit wc.
  constexpr int kXChunks = kBn * 8 / kThreads;
  constexpr int kWUnits = L::kWRowBytes / 16;
  constexpr int kWRowsPerPass = kThreads / kWUnits;
  constexpr int kWChunks = kBlockRows / kWRowsPerPass;
  const int xr = tid / 8, xc = tid % 8;
  const uint32_t x_dst = xr * 128 + ((xc ^ (xr & 7)) << 4);
  const T* x_src = x + (m0 + xr) * K + xc * 8;
  const int x_rows_left = static_cast<int>(min(int64_t{kBn}, M - m0)) - xr;
  const int wr = tid / kWUnits, wc = tid % kWUnits;
  const uint32_t w_dst = L::kXBytes + wr * L::kWStride + wc * 16;
  const int w_rows_left = static_cast<int>(min(int64_t{kBlockRows}, N - n0)) - wr;
  const uint8_t* w_src = w.weight + (n0 + wr) * w.row_bytes + wc * 16;
  const bool s_ok = n0 + tid < N;
  const int64_t s_base = s_ok ? (n0 + tid) * K : 0;

  auto issue = [&](int kb) {
    const uint32_t stage = smem_addr + (kb % kStages) * L::kStageBytes;
    const int k0 = kb * kKBlock;
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const bool ok = 32 * i < x_rows_left;
      CpAsync16(stage + x_dst + i * 32 * 128, ok ? x_src + int64_t{32 * i} * K + k0 : x, ok);
    }
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
      const bool ok = i * kWRowsPerPass < w_rows_left;
      CpAsync16(
          stage + w_dst + i * kWRowsPerPass * L::kWStride,
          ok ? w_src + int64_t{i * kWRowsPerPass} * w.row_bytes + kb * L::kWRowBytes : w.weight,
          ok);
    }
    if constexpr (kNf4) {
      if (tid < kBlockRows) {
        const int64_t b = s_ok ? (s_base + k0) >> w.block_shift : 0;
        const uint32_t dst = stage + L::kXBytes + L::kWBytes + tid * 8;
        if constexpr (kDq) {
          CpAsync4(dst, w.absmax_q + (b & ~int64_t{3}), s_ok);
          CpAsync4(dst + 4, w.nested_absmax + b / 256, s_ok);
        } else {
          CpAsync4(dst, w.absmax + b, s_ok);
        }
      }
    }
  };

  // Prefetch distance kStages - 2: a stage is refilled only after the barrier that follows the
  // wgmma's reading it, which complete one k-block later (WgmmaWait<1>).
#pragma unroll
  for (int i = 0; i < kStages - 2; ++i) {
    if (i < k_blocks) issue(i);
    CpAsyncCommit();
  }
  CodeTable tab = {};
  float offset = 0.f;
  if constexpr (kNf4) {
    tab = LoadCodeTable<T>(w.code);
    if constexpr (kDq) {
      s_nested[tid] = __ldg(w.nested_code + tid);
      offset = __ldg(w.offset);
    }
  }

  float acc[kTiles][kAcc];                  // set by the first k-block's wgmma's (no accumulate)
  const uint32_t sel = t | ((t + 4) << 4);  // byte t of two words
  uint32_t a[kTiles][4][4];                 // [tile][k16 step][fragment register]

  for (int kb = 0; kb < k_blocks; ++kb) {
    CpAsyncWait<kStages - 3>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // stage kb visible to all; every wgmma of k-block kb - 2 has completed
    if (kb + kStages - 2 < k_blocks) issue(kb + kStages - 2);
    CpAsyncCommit();

    const uint8_t* stage = smem + (kb % kStages) * L::kStageBytes;
    const uint8_t* ws = stage + L::kXBytes;
    const uint32_t xs = smem_addr + (kb % kStages) * L::kStageBytes;
    // Two pieces per k-block, each its own wgmma group: the tiles (kTiles = 2) or the halves of
    // the k-block (kTiles = 1). Before a piece's fragments are rewritten, the group that last
    // read them (two groups back) must be done: all but the newest group.
#pragma unroll
    for (int piece = 0; piece < 2; ++piece) {
      const int j = kTiles == 2 ? piece : 0;
      const int s_begin = kTiles == 2 ? 0 : 2 * piece, s_end = kTiles == 2 ? 4 : s_begin + 2;
      WgmmaWait<1>();
      const int row0 = 64 * (kTiles * wg + j) + 16 * warp + g;  // rows row0, row0 + 8
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // row0: fragment registers 0, 2; row0 + 8: 1, 3
        const int r = row0 + 8 * h;
        if constexpr (kNf4) {
          const uint8_t* sc = stage + L::kXBytes + L::kWBytes + r * 8;
          float sv;
          if constexpr (kDq) {
            const int64_t b = ((n0 + r) * K + int64_t{kb} * kKBlock) >> w.block_shift;
            const uint32_t q = (*reinterpret_cast<const uint32_t*>(sc) >> (8 * (b & 3))) & 0xFF;
            sv = __fadd_rn(__fmul_rn(s_nested[q], *reinterpret_cast<const float*>(sc + 4)), offset);
          } else {
            sv = *reinterpret_cast<const float*>(sc);
          }
          const uint32_t sb = Bits(FromFloat<T>(sv));
          const uint32_t scale = sb | (sb << 16);
#pragma unroll
          for (int s = s_begin; s < s_end; s += 2) {  // words 2 s .. 2 s + 3: steps s, s + 1
            const uint4 u = *reinterpret_cast<const uint4*>(ws + r * L::kWStride + 8 * s);
            const uint32_t gw = Permute(Permute(u.x, u.y, sel), Permute(u.z, u.w, sel), 0x5410);
            uint32_t p[4];
            Decode4(tab, gw, p[0], p[1]);
            Decode4(tab, gw >> 16, p[2], p[3]);
            a[j][s][h] = MulPair<T>(p[0], scale);
            a[j][s][h + 2] = MulPair<T>(p[1], scale);
            a[j][s + 1][h] = MulPair<T>(p[2], scale);
            a[j][s + 1][h + 2] = MulPair<T>(p[3], scale);
          }
        } else {
#pragma unroll
          for (int s = s_begin; s < s_end; ++s) {
            const uint4 u = *reinterpret_cast<const uint4*>(ws + r * L::kWStride + 16 * s);
            const uint32_t wa = (t & 2) ? u.y : u.x;
            const uint32_t wb = (t & 2) ? u.w : u.z;
            uint32_t pr[2];
            Int8Pairs<T>(Permute(wa, wb, (t & 1) ? 0x7632 : 0x5410), pr);
            a[j][s][h] = pr[0];
            a[j][s][h + 2] = pr[1];
          }
        }
      }
      WgmmaFence();
#pragma unroll
      for (int s = s_begin; s < s_end; ++s) {
        sm90::WgmmaRs<T, kBn>::Run(acc[j], a[j][s], SwizzledDesc(xs + 32 * s), kb > 0 || s > 0);
      }
      WgmmaCommit();
    }
  }
  WgmmaWait<0>();
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) FenceOperand(acc[j][i]);
  }

  // acc[j][4 c + 2 h + e]: feature row0(j) + 8 h, row of x 8 c + 2 t + e (the wgmma D layout).
  CpAsyncWait<0>();
  __syncthreads();  // every stage is free: the output tile reuses them
  T* tile = reinterpret_cast<T*>(smem);
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 64 * (kTiles * wg + j) + 16 * warp + g + 8 * h;
      const int64_t n = n0 + r;
      float scale = 1.f, b = 0.f;
      if (n < N) {
        if constexpr (!kNf4) scale = __ldg(w.absmax + n) / 127.f;
        if (bias != nullptr) b = ToFloat(bias[n]);
      }
#pragma unroll
      for (int c = 0; c < kBn / 8; ++c) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          tile[(8 * c + 2 * t + e) * L::kOutStride + r] =
              FromFloat<T>(fmaf(acc[j][4 * c + 2 * h + e], scale, b));
        }
      }
    }
  }
  __syncthreads();
  constexpr int kChunksPerRow = kBlockRows * 2 / 16;
  for (int q = tid; q < kBn * kChunksPerRow; q += kThreads) {
    const int r = q / kChunksPerRow, c = q % kChunksPerRow;
    const int64_t m = m0 + r, n = n0 + 8 * c;
    if (m < M && n < N) {
      *reinterpret_cast<uint4*>(out + m * N + n) =
          *reinterpret_cast<const uint4*>(tile + r * L::kOutStride + 8 * c);
    }
  }
#endif
}

// Whether this build's image of the kernels runs on the current device: compiled for sm_90a
// only, so any other device has no image (cudaFuncGetAttributes fails). Cached per device.
bool KernelsLoadable() {
  static std::atomic<uint64_t> known{0}, yes{0};
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device % 64);
  if ((known.load(std::memory_order_acquire) & bit) == 0) {
    cudaFuncAttributes attributes;
    const cudaError_t err =
        cudaFuncGetAttributes(&attributes, WgmmaLinearKernel<__half, 2, 128, true, false>);
    if (err == cudaSuccess && attributes.binaryVersion == 90) {
      yes.fetch_or(bit, std::memory_order_release);
    } else {
      (void)cudaGetLastError();  // clear the sticky-free error of the failed query
    }
    known.fetch_or(bit, std::memory_order_release);
  }
  return (yes.load(std::memory_order_acquire) & bit) != 0;
}

template <typename T, int kTiles, int kBn, bool kNf4, bool kDq>
void Launch(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
            cudaStream_t stream) {
  constexpr int smem = Smem<kTiles, kBn, kNf4>::kBytes;
  constexpr int kBlockRows = Smem<kTiles, kBn, kNf4>::kBlockRows;
  static std::atomic<uint64_t> prepared{0};
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device % 64);
  auto kernel = WgmmaLinearKernel<T, kTiles, kBn, kNf4, kDq>;
  if ((prepared.load(std::memory_order_acquire) & bit) == 0) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    prepared.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(static_cast<unsigned>((w.rows + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>((m + kBn - 1) / kBn));
  kernel<<<grid, kThreads, smem, stream>>>(w, x, m, bias, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kTiles, int kBn>
void LaunchAs(const PackedWeightView& w, const T* x, int m, const T* bias, T* out,
              cudaStream_t stream) {
  if (w.nf4 && w.double_quant) {
    return Launch<T, kTiles, kBn, true, true>(w, x, m, bias, out, stream);
  }
  if (w.nf4) return Launch<T, kTiles, kBn, true, false>(w, x, m, bias, out, stream);
  return Launch<T, kTiles, kBn, false, false>(w, x, m, bias, out, stream);
}

template <typename T>
void LaunchTyped(const PackedWeightView& w, const void* x, int64_t m, const void* bias, void* out,
                 const WgmmaTile& tile, cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return;
  TORCH_CHECK(m <= (int64_t{1} << 30), "LaunchWgmmaLinear: too many rows");
  const int mi = static_cast<int>(m);
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* ot = static_cast<T*>(out);
  if (tile.tiles == 1 && tile.rows == 256) return LaunchAs<T, 1, 256>(w, xt, mi, bt, ot, stream);
  if (tile.tiles == 1 && tile.rows == 128) return LaunchAs<T, 1, 128>(w, xt, mi, bt, ot, stream);
  if (tile.tiles == 2 && tile.rows == 128) return LaunchAs<T, 2, 128>(w, xt, mi, bt, ot, stream);
  TORCH_CHECK(false, "LaunchWgmmaLinear: no kernel for ", tile.tiles, " tiles of ", tile.rows,
              " rows");
}

}  // namespace

bool WgmmaLinearSupported(const PackedWeightView& w, const void* x, const void* out, int64_t m,
                          ElemType type) {
  if (type == ElemType::kFloat || m < 1) return false;
  if (w.in_features < kKBlock || w.in_features % kKBlock != 0 || w.rows % 8 != 0 || !Aligned16(x) ||
      !Aligned16(out)) {
    return false;
  }
  if (w.nf4 && (w.padded_in != w.in_features || w.blocksize < kKBlock)) return false;
  if (!w.nf4 && w.row_bytes != w.in_features) return false;
  return KernelsLoadable();
}

void LaunchWgmmaLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                       void* out, ElemType type, const WgmmaTile& tile, cudaStream_t stream) {
  switch (type) {
    case ElemType::kHalf:
      return LaunchTyped<__half>(w, x, m, bias, out, tile, stream);
    case ElemType::kBFloat16:
      return LaunchTyped<__nv_bfloat16>(w, x, m, bias, out, tile, stream);
    case ElemType::kFloat:
      break;
  }
  TORCH_CHECK(false, "LaunchWgmmaLinear: float32 x is not supported");
}

}  // namespace qpool::quant::cuda
