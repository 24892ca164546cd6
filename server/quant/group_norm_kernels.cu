#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "quant/group_norm_kernels.h"
#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

// Note [Group norm op] has the plan. A block covers `chunk` pixels of one image
// (blockIdx.y); its threads form `rows` rows of `vecs` threads, thread (row, vec) owning the
// 16-byte vector of channels vec of pixels row, row + rows, ... of the chunk, so a block reads
// whole consecutive pixels.
constexpr int kThreads = kElementwiseThreads;  // threads per block, unless one pixel needs more
constexpr int kMaxVectors = 512;  // 16-byte vectors of channels: statistics' shared memory 32 KB
constexpr int kUnroll = 4;        // pixels loaded before any is used, for loads in flight
constexpr int kPartial = 3;       // count, mean, M2

struct Layout {
  int vecs, rows, splits;
  int64_t chunk;
};

// Where the partial statistics (count, mean, M2) of (image, chunk, group) start.
__device__ __forceinline__ int64_t PartialOffset(int64_t image, int split, int splits, int groups,
                                                 int g) {
  return ((image * splits + split) * groups + g) * kPartial;
}

template <typename T>
__device__ __forceinline__ float WithAdd(T v, float add, bool has_add) {
  // The unfused graph rounds x + add to x's dtype before the norm reads it.
  return has_add ? ToFloat(FromFloat<T>(ToFloat(v) + add)) : ToFloat(v);
}

template <typename T, int kValues>
__global__ void GroupNormStatsKernel(const T* __restrict__ x, const T* __restrict__ add,
                                     int64_t pixels, int c, int groups, int64_t chunk,
                                     float* __restrict__ partial) {
  using P = Pack<T, kValues, 16>;
  extern __shared__ float shared[];
  const int vecs = c / kValues, rows = blockDim.x / vecs;
  const int vec = threadIdx.x % vecs, row = threadIdx.x / vecs;
  const int64_t image = blockIdx.y;
  const int64_t begin = blockIdx.x * chunk, end = MinI64(pixels, begin + chunk);
  const T* base = x + image * pixels * c + vec * kValues;
  float a[kValues], mean[kValues], m2[kValues];
#pragma unroll
  for (int j = 0; j < kValues; ++j) {
    a[j] = add ? ToFloat(add[image * c + vec * kValues + j]) : 0.f;
    mean[j] = m2[j] = 0.f;
  }
  float count = 0.f;
  for (int64_t p = begin + row; p < end; p += int64_t{kUnroll} * rows) {
    P packs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = p + int64_t{u} * rows;
      if (q < end) packs[u] = *reinterpret_cast<const P*>(base + q * c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (p + int64_t{u} * rows >= end) break;
      count += 1.f;
      const float inv = 1.f / count;
#pragma unroll
      for (int j = 0; j < kValues; ++j) {  // Welford
        const float v = WithAdd(packs[u].v[j], a[j], add != nullptr);
        const float d = v - mean[j];
        mean[j] += d * inv;
        m2[j] += d * (v - mean[j]);
      }
    }
  }
  // Per (row, channel) means and M2 in shared memory, then per group with Chan's formula: the
  // group's mean from the count-weighted means, then M2 as the sum of the parts' M2 and of their
  // counts times their means' squared distance to it.
  float* s_mean = shared;
  float* s_m2 = shared + rows * c;
  float* s_count = shared + 2 * rows * c;
#pragma unroll
  for (int j = 0; j < kValues; ++j) {
    s_mean[row * c + vec * kValues + j] = mean[j];
    s_m2[row * c + vec * kValues + j] = m2[j];
  }
  if (vec == 0) s_count[row] = count;
  __syncthreads();
  const int per_group = c / groups;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float total = 0.f, sum = 0.f;
    for (int r = 0; r < rows; ++r) {
      for (int ch = g * per_group; ch < (g + 1) * per_group; ++ch)
        sum += s_count[r] * s_mean[r * c + ch];
      total += s_count[r] * per_group;
    }
    const float group_mean = total > 0.f ? sum / total : 0.f;
    float group_m2 = 0.f;
    for (int r = 0; r < rows; ++r) {
      for (int ch = g * per_group; ch < (g + 1) * per_group; ++ch) {
        const float d = s_mean[r * c + ch] - group_mean;
        group_m2 += s_m2[r * c + ch] + s_count[r] * d * d;
      }
    }
    float* out = partial + PartialOffset(image, blockIdx.x, gridDim.x, groups, g);
    out[0] = total;
    out[1] = group_mean;
    out[2] = group_m2;
  }
}

template <typename T, int kValues>
__global__ void GroupNormApplyKernel(const T* __restrict__ x, const T* __restrict__ add,
                                     const T* __restrict__ weight, const T* __restrict__ bias,
                                     int64_t pixels, int c, int groups, int64_t chunk, float eps,
                                     bool silu, const float* __restrict__ partial,
                                     T* __restrict__ out) {
  using P = Pack<T, kValues, 16>;
  extern __shared__ float shared[];
  float* s_scale = shared;
  float* s_shift = shared + c;
  float* s_mean = shared + 2 * c;
  float* s_rstd = shared + 2 * c + groups;
  const int64_t image = blockIdx.y;
  const int splits = gridDim.x;
  // The image's group statistics from every block's partial (Chan's formula again).
  for (int g = threadIdx.x; g < groups; g += blockDim.x) {
    float total = 0.f, sum = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float* part = partial + PartialOffset(image, s, splits, groups, g);
      total += part[0];
      sum += part[0] * part[1];
    }
    const float mean = sum / total;
    float m2 = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float* part = partial + PartialOffset(image, s, splits, groups, g);
      const float d = part[1] - mean;
      m2 += part[2] + part[0] * d * d;
    }
    s_mean[g] = mean;
    s_rstd[g] = rsqrtf(m2 / total + eps);
  }
  __syncthreads();
  const int per_group = c / groups;
  for (int ch = threadIdx.x; ch < c; ch += blockDim.x) {
    const int g = ch / per_group;
    const float scale = s_rstd[g] * ToFloat(weight[ch]);
    s_scale[ch] = scale;
    s_shift[ch] = ToFloat(bias[ch]) - s_mean[g] * scale;
  }
  __syncthreads();
  const int vecs = c / kValues, rows = blockDim.x / vecs;
  const int vec = threadIdx.x % vecs, row = threadIdx.x / vecs;
  float a[kValues], scale[kValues], shift[kValues];
#pragma unroll
  for (int j = 0; j < kValues; ++j) {
    const int ch = vec * kValues + j;
    a[j] = add ? ToFloat(add[image * c + ch]) : 0.f;
    scale[j] = s_scale[ch];
    shift[j] = s_shift[ch];
  }
  const int64_t begin = blockIdx.x * chunk, end = MinI64(pixels, begin + chunk);
  const int64_t offset = image * pixels * c + vec * kValues;
  for (int64_t p = begin + row; p < end; p += int64_t{kUnroll} * rows) {
    P packs[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = p + int64_t{u} * rows;
      if (q < end) packs[u] = *reinterpret_cast<const P*>(x + offset + q * c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = p + int64_t{u} * rows;
      if (q >= end) break;
      P o;
#pragma unroll
      for (int j = 0; j < kValues; ++j) {
        float y = WithAdd(packs[u].v[j], a[j], add != nullptr) * scale[j] + shift[j];
        if (silu) y = y / (1.f + expf(-y));
        o.v[j] = FromFloat<T>(y);
      }
      *reinterpret_cast<P*>(out + offset + q * c) = o;
    }
  }
}

template <typename T>
constexpr int kVector = 16 / sizeof(T);

int VectorOf(ElemType type) { return type == ElemType::kFloat ? 4 : 8; }

// Chunks per image: about four blocks per multiprocessor over the whole batch, each chunk at
// least one pixel per thread row.
Layout LayoutOf(const GroupNormArgs& args) {
  Layout l;
  l.vecs = static_cast<int>(args.c / VectorOf(args.type));
  l.rows = std::max(1, kThreads / l.vecs);
  const int64_t wanted = (int64_t{SmCount()} * 4 + args.n - 1) / std::max<int64_t>(args.n, 1);
  const int64_t most = (args.pixels + l.rows - 1) / l.rows;
  const int64_t splits = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(most, 1));
  l.chunk = (args.pixels + splits - 1) / splits;
  l.splits = static_cast<int>((args.pixels + l.chunk - 1) / l.chunk);
  return l;
}

template <typename T>
void Launch(const GroupNormArgs& args, float* workspace, cudaStream_t stream) {
  constexpr int kValues = kVector<T>;
  const Layout l = LayoutOf(args);
  const dim3 grid(static_cast<unsigned>(l.splits), static_cast<unsigned>(args.n));
  const int threads = l.vecs * l.rows;
  const int c = static_cast<int>(args.c), groups = static_cast<int>(args.groups);
  const T* x = static_cast<const T*>(args.x);
  const T* add = static_cast<const T*>(args.add);
  const size_t stats_shared = sizeof(float) * (2 * static_cast<size_t>(l.rows) * c + l.rows);
  GroupNormStatsKernel<T, kValues>
      <<<grid, threads, stats_shared, stream>>>(x, add, args.pixels, c, groups, l.chunk, workspace);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const size_t apply_shared = sizeof(float) * (2 * static_cast<size_t>(c) + 2 * groups);
  GroupNormApplyKernel<T, kValues><<<grid, threads, apply_shared, stream>>>(
      x, add, static_cast<const T*>(args.weight), static_cast<const T*>(args.bias), args.pixels, c,
      groups, l.chunk, args.eps, args.silu, workspace, static_cast<T*>(args.out));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool GroupNormSupported(const GroupNormArgs& args) {
  const int64_t vector = VectorOf(args.type);
  return args.n > 0 && args.pixels > 0 && args.c % vector == 0 && args.c / vector <= kMaxVectors &&
         args.groups > 0 && args.c % args.groups == 0 && args.n <= 65535 && Aligned16(args.x);
}

int64_t GroupNormWorkspaceFloats(const GroupNormArgs& args) {
  return args.n * LayoutOf(args).splits * args.groups * kPartial;
}

void LaunchGroupNorm(const GroupNormArgs& args, float* workspace, cudaStream_t stream) {
  TORCH_CHECK(GroupNormSupported(args) && Aligned16(args.out),
              "qpool::group_norm: arguments the CUDA kernels do not take");
  WithElemType(args.type, [&](auto zero) { Launch<decltype(zero)>(args, workspace, stream); });
}

}  // namespace qpool::quant::cuda
