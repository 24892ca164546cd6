// CUDA kernels of qpool::quant_linear behind a torch-free interface (raw pointers + stream), so
// the .cu file compiles without the ATen headers. Callers: quant_linear_cuda.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace qpool::quant::cuda {

// Element type of activations, outputs and dequantized weights.
enum class ElemType { kFloat, kHalf, kBFloat16 };

// Device pointers and sizes of one packed weight (Note [Quantized weight layouts]).
struct PackedWeightView {
  const uint8_t* weight = nullptr;  // int8 or packed nf4 bytes, [rows, row_bytes], contiguous
  bool nf4 = false;
  bool double_quant = false;
  int64_t rows = 0;         // N
  int64_t in_features = 0;  // K
  int64_t padded_in = 0;    // Kp
  int64_t row_bytes = 0;
  int64_t blocksize = 0;
  int block_shift = 0;  // log2(blocksize) for nf4
  const float* absmax = nullptr;      // int8 [N] or nf4 [nblocks]
  const uint8_t* absmax_q = nullptr;  // nf4 double quant [nblocks]
  const float* code = nullptr;        // nf4 [16]
  const float* nested_absmax = nullptr;
  const float* nested_code = nullptr;  // [256]
  const float* offset = nullptr;       // [1]
};

// Writes the dequantized [N, K] weight (contiguous, `type`) to `out`; bit-identical to the CPU
// Dequantize() before the cast.
void LaunchDequantize(const PackedWeightView& w, void* out, ElemType type, cudaStream_t stream);

// out[m, n] = sum_k x[m, k] * w[n, k] + bias[n] for contiguous x [M, K] and out [M, N] of `type`,
// bias of `type` or null. Reads each packed row once per 16 rows of x; meant for M <= 4.
void LaunchFusedLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                       void* out, ElemType type, cudaStream_t stream);

// Largest M the tensor-core small-M kernel takes (one m16 tile of x); larger M go to the
// medium-M kernel (Note [Tensor-core medium-M linear]).
inline constexpr int64_t kMmaMaxRows = 16;

// Whether LaunchMmaLinear can run this weight with x (fp16/bf16, 16-byte aligned rows, nf4
// without row padding, packed rows a multiple of 16 bytes, m >= 1).
bool MmaLinearSupported(const PackedWeightView& w, const void* x, int64_t m, ElemType type);

// The small-M kernel's block shape, 0 = chosen by the layer (Note [Small-M block shape];
// benchmarks and tests set them to measure or check one): n8 tiles per warp (2 or 4) and splits
// of k over a cluster (1-8, used where clusters are).
struct MmaShape {
  int tiles = 0;
  int splits = 0;
};

// What LaunchMmaLinear needs to know of the device it runs on.
struct MmaDevice {
  int sm_count = 1;       // multiprocessors
  bool clusters = false;  // thread-block clusters (compute capability >= 9.0)
  MmaShape shape;         // forced block shape, if any
};

// How LaunchMmaLinear runs a weight for m <= kMmaMaxRows on the current device (Note [Small-M
// block shape]): n8 tiles per warp, splits of k over a cluster, blocks along the features, and
// resident blocks per multiprocessor of that kernel. Host code.
struct MmaPlan {
  int tiles = 2;
  int splits = 1;
  int64_t blocks = 0;
  int blocks_per_sm = 1;
};
MmaPlan PlanMmaLinear(const PackedWeightView& w, int64_t m, ElemType type, const MmaDevice& device);

// Same contract as LaunchFusedLinear on tensor cores, in one launch without workspace: for
// m <= kMmaMaxRows each packed weight byte is read once and applied to all m rows (Note
// [Tensor-core small-M linear]); larger m run LaunchMmaMediumLinear. Requires MmaLinearSupported().
void LaunchMmaLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                     void* out, ElemType type, const MmaDevice& device, cudaStream_t stream);

// LaunchMmaLinear for m > kMmaMaxRows (Note [Tensor-core medium-M linear]): each packed weight
// byte is read and decoded once per group of up to 80 rows of x. Requires MmaLinearSupported().
void LaunchMmaMediumLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                           void* out, ElemType type, const MmaDevice& device, cudaStream_t stream);

// Whether LaunchWgmmaLinear can run this weight with x on the current device: a Hopper GPU (the
// kernels are built for sm_90a only), fp16/bf16, K a multiple of 64, N a multiple of 8, 16-byte
// aligned x and weight, nf4 blocks of at least 64 values without row padding. `out` must be
// 16-byte aligned too (every caching-allocator block is).
bool WgmmaLinearSupported(const PackedWeightView& w, const void* x, int64_t m, ElemType type);

// Launch shape of LaunchWgmmaLinear: rows of x per output tile (64, 128 or 256; 128 features each),
// the multiprocessors its persistent grid fills and how tiles are spread over its blocks (Note
// [Stream-K schedule]; kAuto picks by the shape).
enum class WgmmaSchedule { kAuto, kDataParallel, kStreamK };
struct WgmmaTile {
  int rows = 256;
  int sm_count = 1;
  WgmmaSchedule schedule = WgmmaSchedule::kAuto;
};

// Bytes of device workspace LaunchWgmmaLinear needs for this weight, m and tile: f32 partial
// sums and flags for the tiles its stream-K schedule splits between blocks (Note [Stream-K
// schedule]); 0 when it splits none.
int64_t WgmmaWorkspaceBytes(const PackedWeightView& w, int64_t m, const WgmmaTile& tile);

// Same contract as LaunchFusedLinear for large M on Hopper tensor cores, dequantizing inside the
// tile loop (Note [Warpgroup-MMA large-M linear]). Requires WgmmaLinearSupported() and, when
// WgmmaWorkspaceBytes() is not 0, that many bytes of 16-byte aligned device memory in
// `workspace`, used on `stream` only.
void LaunchWgmmaLinear(const PackedWeightView& w, const void* x, int64_t m, const void* bias,
                       void* out, ElemType type, const WgmmaTile& tile, void* workspace,
                       cudaStream_t stream);

}  // namespace qpool::quant::cuda
