// CUDA kernels of the w8a8 linear (Note [W8A8 linear], Note [Fused W8A8 kernels]) behind a
// torch-free interface (raw pointers + stream), like quant_kernels.h. Caller:
// quant_linear_cuda.cpp (qpool::quant_linear and qpool::geglu_quant_linear).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/quant_kernels.h"

namespace qpool::quant::cuda {

// For contiguous x [m, k] of `type` and activation scales smooth float32 [k]: row_amax[r] =
// max_k |x[r, k] / smooth[k]| and q[r, k] = clamp(round_half_even(x[r, k] / smooth[k] / d_r *
// 127), -127, 127) with d_r = row_amax[r], or 1 where it is 0; and, when row_scale is not null,
// row_scale[r] = row_amax[r] / 127 (LaunchW8A8Wgmma's). Bit-identical to the ATen operations of
// W8A8Linear on any device.
void LaunchW8A8QuantizeRows(const void* x, ElemType type, const float* smooth, int64_t m, int64_t k,
                            int8_t* q, float* row_amax, float* row_scale, cudaStream_t stream);

// Note [GEGLU rows]
// The feed-forward of a UNet transformer block is geglu(proj(x)) followed by the down projection,
// a w8a8 layer whose input rows are the GEGLU's output: written in fp16 by one pass, read by the
// quantizing pass. LaunchW8A8GegluQuantizeRows computes each row of the GEGLU (value * gelu(gate),
// GegluValue, as qpool::geglu's kernel writes it) in the quantizing kernel's registers instead, so
// that row is never stored: q, row_amax and row_scale are LaunchW8A8QuantizeRows's of
// LaunchGeglu's output, byte for byte (GPU test), from one pass over x. Its time against the two
// passes: bench/results/README.md ("GEGLU rows").

// Whether LaunchW8A8GegluQuantizeRows takes these rows: 16-bit x whose rows (stride_x elements
// apart, at least 2d) hold value and gate halves of d values each, d and stride_x multiples of 8,
// at most the held rows' width, and 16-byte aligned x and smooth. Reads no output, so a caller
// asks before allocating them.
bool W8A8GegluRowsSupported(const void* x, int64_t stride_x, int64_t d, ElemType type,
                            const float* smooth);

// LaunchW8A8QuantizeRows of geglu(x) [m, d] for x [m, 2d] of `type` with row stride stride_x
// (Note [GEGLU rows]). Requires W8A8GegluRowsSupported() and a 16-byte aligned q (every
// caching-allocator block is).
void LaunchW8A8GegluQuantizeRows(const void* x, int64_t stride_x, ElemType type,
                                 const float* smooth, int64_t m, int64_t d, int8_t* q,
                                 float* row_amax, float* row_scale, cudaStream_t stream);

// out[r, c] = acc[r, c] * (row_amax[r] / 127) * (absmax[c] / 127) + bias[c], each operation
// rounded in float32 (no fused multiply-add), cast to `type`, for contiguous int32 acc and out
// [m, n]; bias float32 [n] or null. n must be a multiple of 4.
void LaunchW8A8Epilogue(const int32_t* acc, const float* row_amax, const float* absmax,
                        const float* bias, int64_t m, int64_t n, void* out, ElemType type,
                        cudaStream_t stream);

// Whether LaunchW8A8Wgmma runs this product on the current device: a Hopper GPU (sm_90a image),
// fp16/bf16 out, K a multiple of 16, N of 8, 16-byte aligned q and weight.
bool W8A8WgmmaSupported(int64_t m, int64_t k, int64_t n, const void* q, const void* weight,
                        ElemType type);

// The tiles of LaunchW8A8Wgmma: both consumer warpgroups on one tile of 128 features x up to 256
// rows of x, stream-K where it pays (Note [Warpgroup-MMA W8A8 linear]), or a 128 x 128 tile of
// each, alternating (Note [Ping-pong W8A8 tiles]); kAuto picks by the shape (Note [W8A8 tile
// choice]).
enum class W8A8Tiles { kAuto, kShared, kPingPong };

// Bytes of device workspace LaunchW8A8Wgmma needs on `sm_count` multiprocessors: int32 partial
// sums and flags for the tiles its stream-K schedule splits between blocks; 0 when none.
int64_t W8A8WgmmaWorkspaceBytes(int64_t m, int64_t k, int64_t n, int sm_count,
                                W8A8Tiles tiles = W8A8Tiles::kAuto);

// out [m, n] (contiguous, `type`, 16-byte aligned) = the w8a8 product of the quantized rows q
// [m, k] and their row_scale [m] (LaunchW8A8QuantizeRows) and the int8 weight [n, k], scaled
// and biased as
// LaunchW8A8Epilogue does to at::_int_mm's product, with the same bytes, in one kernel (Note
// [Warpgroup-MMA W8A8 linear]). The bias (or null) is float32 or of `type` (`bias_type`); a
// 16-bit bias is widened exactly in the epilogue, so no cast runs before the launch. Requires
// W8A8WgmmaSupported() and, when W8A8WgmmaWorkspaceBytes() is not 0, that many bytes of 16-byte
// aligned device memory in `workspace`, used on `stream` only.
void LaunchW8A8Wgmma(const int8_t* q, const float* row_scale, const int8_t* weight,
                     const float* absmax, const void* bias, ElemType bias_type, int64_t m,
                     int64_t k, int64_t n, void* out, ElemType type, int sm_count, void* workspace,
                     cudaStream_t stream, W8A8Tiles tiles = W8A8Tiles::kAuto);

}  // namespace qpool::quant::cuda
