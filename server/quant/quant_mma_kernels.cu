// CUDA kernel for qpool::quant_linear at small M (fp16/bf16 x, M <= kMmaMaxRows): a tensor-core
// GEMM that reads each packed weight byte once and applies it to every row of x.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "quant/quant_kernel_common.cuh"
#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {
namespace {

// Note [Tensor-core small-M linear]
// For fp16/bf16 x with M <= 16, one mma.sync m16n8k16 per 16 values of k computes a 16 x 8 tile
// of out (rows of x x output features); x is A, the decoded weight B. Lane (g, t) = (lane / 4,
// lane % 4) of a warp owns output feature n0 + g (B column g) and loads 16 contiguous packed
// bytes of that row at byte t * 16 of each 64-byte step (kValues = 32 nf4 or 16 int8 values),
// so a quad reads 64 contiguous bytes. The sum over k does not care about the order of k, so
// instead of the mma's own k numbering we let mma step s of a chunk take the lane's values
// 4s .. 4s + 3 (as its k pairs 2t and 2t + 8) and load A with the same permutation: lane (g, t)
// reads x[g][k0 .. k0 + kValues) and x[g + 8][...] as 16-byte vectors. NF4 nibbles are decoded
// through a 16-entry table of T in shared memory (same index = same word, so no bank conflicts)
// and scaled per 16-value group in T (__hmul2); int8 values are exact in T and the row scale is
// applied at the end in float. Accumulation is float32. Each block is kMmaWarps warps on
// consecutive groups of 8 features; gridDim.y splits k (Note [Split-k]) so that small-N layers
// still fill the GPU.
// Note [Split-k]: with splits > 1 every split writes float partial sums to a workspace
// [splits, M, N] and MmaReduceKernel adds them, the bias and the int8 scale.
constexpr int kMmaWarps = 8;
constexpr int kMmaUnroll = 2;       // 64-byte steps per quad in flight
constexpr int kMmaStepBytes = 64;   // packed bytes per quad per step
constexpr int kMmaBlocksPerSm = 4;  // target resident blocks per SM when choosing splits

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
__device__ __forceinline__ uint32_t PackPair(uint32_t lo_bits, uint32_t hi_bits) {
  return (lo_bits & 0xffffu) | (hi_bits << 16);
}

template <typename T>
__device__ __forceinline__ uint32_t MulPair(uint32_t a, uint32_t b) {
  using P = typename Pair<T>::Type;
  P r = __hmul2(*reinterpret_cast<const P*>(&a), *reinterpret_cast<const P*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

template <typename T>
__device__ __forceinline__ void Mma(float* c, const uint32_t* a, const uint32_t* b);
template <>
__device__ __forceinline__ void Mma<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float* c, const uint32_t* a,
                                                   const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Writes value c of (row m, feature n): to out with scale and bias, or to the split's partials.
template <typename T>
__device__ __forceinline__ void MmaStore(const PackedWeightView& w, int m, int64_t n, float c,
                                         int64_t M, const T* bias, T* out, float* partial) {
  if (m >= M || n >= w.rows) return;
  if (partial != nullptr) {
    partial[(blockIdx.y * M + m) * w.rows + n] = c;
    return;
  }
  const float scale = w.nf4 ? 1.f : w.absmax[n] / 127.f;
  const float b = bias != nullptr ? ToFloat(bias[n]) : 0.f;
  out[m * w.rows + n] = FromFloat<T>(fmaf(c, scale, b));
}

template <typename T, bool kNf4, bool kRows16>
__global__ void __launch_bounds__(kMmaWarps* kWarp)
    MmaLinearKernel(PackedWeightView w, const T* x, int64_t M, const T* bias, T* out,
                    float* partial, int64_t split_bytes) {
  __shared__ uint32_t s_code[16];  // nf4 code values as bits of T
  __shared__ float s_nested[256];
  if (kNf4) {
    for (int i = threadIdx.x; i < 16; i += blockDim.x) s_code[i] = Bits(FromFloat<T>(w.code[i]));
    if (w.double_quant) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) s_nested[i] = w.nested_code[i];
    }
  }
  __syncthreads();
  constexpr int kValues = kNf4 ? 2 * kChunkBytes : kChunkBytes;  // per lane per step
  constexpr int kXWords = kValues / 2;                             // 32-bit words of x per row
  const int lane = threadIdx.x % kWarp;
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = (blockIdx.x * int64_t{kMmaWarps} + threadIdx.x / kWarp) * 8;
  if (n0 >= w.rows) return;
  const int64_t n = n0 + g;
  const bool row_ok = n < w.rows;
  const int64_t K = w.in_features;
  const uint8_t* wrow = w.weight + (row_ok ? n : 0) * w.row_bytes;
  const bool x0_ok = g < M, x1_ok = kRows16 && g + 8 < M;
  const T* x0 = x + (x0_ok ? g : 0) * K;
  const T* x1 = x + (x1_ok ? g + 8 : 0) * K;
  const int64_t begin = blockIdx.y * split_bytes;
  const int64_t end = MinI64(begin + split_bytes, w.row_bytes);
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t step = begin; step < end; step += kMmaStepBytes * kMmaUnroll) {
    uint4 wv[kMmaUnroll];
    uint32_t xa[kMmaUnroll][kXWords], xb[kMmaUnroll][kXWords];
    uint32_t scale[kMmaUnroll][2];
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t b0 = step + u * kMmaStepBytes + t * kChunkBytes;
      const bool in_k = b0 < end;
      const int64_t k0 = kNf4 ? 2 * b0 : b0;
      wv[u] = in_k && row_ok ? __ldg(reinterpret_cast<const uint4*>(wrow + b0))
                             : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < kXWords / 4; ++i) {
        const uint4 z = make_uint4(0, 0, 0, 0);
        const uint4 a = in_k && x0_ok ? __ldg(reinterpret_cast<const uint4*>(x0 + k0) + i) : z;
        const uint4 b = in_k && x1_ok ? __ldg(reinterpret_cast<const uint4*>(x1 + k0) + i) : z;
        xa[u][4 * i] = a.x, xa[u][4 * i + 1] = a.y, xa[u][4 * i + 2] = a.z, xa[u][4 * i + 3] = a.w;
        xb[u][4 * i] = b.x, xb[u][4 * i + 1] = b.y, xb[u][4 * i + 2] = b.z, xb[u][4 * i + 3] = b.w;
      }
      if constexpr (kNf4) {
        float s0 = 0.f, s1 = 0.f;
        if (in_k && row_ok) {
          const int64_t v0 = n * w.padded_in + k0;
          s0 = BlockScale(w, s_nested, v0 >> w.block_shift);
          s1 = BlockScale(w, s_nested, (v0 + 16) >> w.block_shift);
        }
        const uint32_t h0 = Bits(FromFloat<T>(s0)), h1 = Bits(FromFloat<T>(s1));
        scale[u][0] = h0 | (h0 << 16);
        scale[u][1] = h1 | (h1 << 16);
      }
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const uint32_t words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
      for (int s = 0; s < kValues / 4; ++s) {
        uint32_t b[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int pair = 2 * s + h;  // values 2 * pair, 2 * pair + 1 of the lane's chunk
          if constexpr (kNf4) {
            const uint32_t byte = (words[pair / 4] >> (8 * (pair % 4))) & 0xffu;
            b[h] = MulPair<T>(PackPair<T>(s_code[byte >> 4], s_code[byte & 15]),
                              scale[u][pair < 8 ? 0 : 1]);
          } else {
            const uint32_t word = words[pair / 2];
            const int sh = 16 * (pair % 2);
            const auto q0 = static_cast<int8_t>((word >> sh) & 0xffu);
            const auto q1 = static_cast<int8_t>((word >> (sh + 8)) & 0xffu);
            b[h] = PackPair<T>(Bits(FromFloat<T>(static_cast<float>(q0))),
                               Bits(FromFloat<T>(static_cast<float>(q1))));
          }
        }
        const uint32_t a[4] = {xa[u][2 * s], xb[u][2 * s], xa[u][2 * s + 1], xb[u][2 * s + 1]};
        Mma<T>(c, a, b);
      }
    }
  }
  const int64_t nc = n0 + 2 * t;
  MmaStore(w, g, nc, c[0], M, bias, out, partial);
  MmaStore(w, g, nc + 1, c[1], M, bias, out, partial);
  if (kRows16) {
    MmaStore(w, g + 8, nc, c[2], M, bias, out, partial);
    MmaStore(w, g + 8, nc + 1, c[3], M, bias, out, partial);
  }
}

template <typename T>
__global__ void MmaReduceKernel(PackedWeightView w, const float* partial, int splits, int64_t M,
                                const T* bias, T* out) {
  const int64_t total = M * w.rows;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += partial[s * total + i];
    const int64_t n = i % w.rows;
    const float scale = w.nf4 ? 1.f : w.absmax[n] / 127.f;
    const float b = bias != nullptr ? ToFloat(bias[n]) : 0.f;
    out[i] = FromFloat<T>(fmaf(sum, scale, b));
  }
}

// Bytes of a packed row per split of the tensor-core kernel (a multiple of one unrolled step).
int64_t MmaSplitBytes(const PackedWeightView& w, int sm_count) {
  constexpr int64_t kIter = kMmaStepBytes * kMmaUnroll;
  const int64_t blocks_x = (w.rows + 8 * kMmaWarps - 1) / (8 * kMmaWarps);
  const int64_t want = (int64_t{sm_count} * kMmaBlocksPerSm + blocks_x - 1) / blocks_x;
  const int64_t iters = (w.row_bytes + kIter - 1) / kIter;
  // At least 2 unrolled steps per split (4 gave too few blocks on 1280 x 2048 layers).
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(want, iters / 2));
  return (iters + splits - 1) / splits * kIter;
}

int64_t MmaSplits(const PackedWeightView& w, int sm_count) {
  const int64_t bytes = MmaSplitBytes(w, sm_count);
  return (w.row_bytes + bytes - 1) / bytes;
}

template <typename T>
void MmaAs(const PackedWeightView& w, const T* x, int64_t m, const T* bias, T* out,
           float* workspace, int sm_count, cudaStream_t stream) {
  if (m == 0 || w.rows == 0) return;
  const int64_t split_bytes = MmaSplitBytes(w, sm_count);
  const int64_t splits = MmaSplits(w, sm_count);
  float* partial = splits > 1 ? workspace : nullptr;
  const dim3 grid(static_cast<unsigned>((w.rows + 8 * kMmaWarps - 1) / (8 * kMmaWarps)),
                  static_cast<unsigned>(splits));
  const dim3 block(kMmaWarps * kWarp);
  const bool rows16 = m > 8;
  if (w.nf4) {
    if (rows16) {
      MmaLinearKernel<T, true, true>
          <<<grid, block, 0, stream>>>(w, x, m, bias, out, partial, split_bytes);
    } else {
      MmaLinearKernel<T, true, false>
          <<<grid, block, 0, stream>>>(w, x, m, bias, out, partial, split_bytes);
    }
  } else {
    if (rows16) {
      MmaLinearKernel<T, false, true>
          <<<grid, block, 0, stream>>>(w, x, m, bias, out, partial, split_bytes);
    } else {
      MmaLinearKernel<T, false, false>
          <<<grid, block, 0, stream>>>(w, x, m, bias, out, partial, split_bytes);
    }
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (partial != nullptr) {
    const int64_t total = m * w.rows;
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 4096);
    MmaReduceKernel<T><<<blocks, threads, 0, stream>>>(w, partial, static_cast<int>(splits), m,
                                                       bias, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace

bool MmaLinearSupported(const PackedWeightView& w, const void* x, int64_t m, ElemType type) {
  if (type == ElemType::kFloat || m < 1 || m > kMmaMaxRows) return false;
  if (!Aligned16(w.weight) || !Aligned16(x) || w.row_bytes % kChunkBytes != 0) return false;
  if (w.nf4 && w.padded_in != w.in_features) return false;
  return (w.in_features * 2) % 16 == 0;
}

int64_t MmaLinearWorkspace(const PackedWeightView& w, int64_t m, int sm_count) {
  const int64_t splits = MmaSplits(w, sm_count);
  return splits > 1 ? splits * m * w.rows : 0;
}

void LaunchMmaLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                     void* out, ElemType type, float* workspace, int sm_count,
                     cudaStream_t stream) {
  switch (type) {
    case ElemType::kHalf:
      return MmaAs(w, static_cast<const __half*>(x), m, static_cast<const __half*>(bias),
                   static_cast<__half*>(out), workspace, sm_count, stream);
    case ElemType::kBFloat16:
      return MmaAs(w, static_cast<const __nv_bfloat16*>(x), m,
                   static_cast<const __nv_bfloat16*>(bias), static_cast<__nv_bfloat16*>(out),
                   workspace, sm_count, stream);
    case ElemType::kFloat:
      break;
  }
  TORCH_CHECK(false, "LaunchMmaLinear: float32 x is not supported");
}

}  // namespace qpool::quant::cuda
