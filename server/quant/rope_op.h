// The qpool::rope operator, FLUX's rotary position embedding of q or k in one pass, and
// qpool::rms_rope, the per-head RMS norm before it, fused (Note [Normed rotary embedding op]);
// both registered with the dispatcher for CPU, CUDA and Meta (Note [Rotary embedding op]).
#pragma once

#include <ATen/ATen.h>

namespace qpool::quant {

// Note [Rotary embedding op]
// rope(x [B, N, H, D], cos [1, N, 1, D], sin [1, N, 1, D]) rotates each channel pair (a, b) of
// x into (a cos - b sin, b cos + a sin) with the pair's two table entries, in float32, and
// casts back to x's dtype: diffusers' apply_rotary_emb (use_real, unbind_dim -1), which its
// FLUX attention applies to q and k of every block. Written in ATen operations, as diffusers
// does, that is seven kernels writing float32 copies of x (0.7 GB for q or k of a 1024x1024
// FLUX image, twice per block, 57 blocks per step); the CUDA kernel reads x and the tables once
// and writes the result once. Every value takes the same float32 operations in the same order
// (two products rounded, then their sum rounded, then the cast; no fused multiply-add), so the
// CPU form, the CUDA kernel and diffusers' operations give identical bytes. x is float32,
// float16 or bfloat16 with D even; cos and sin are float32 on x's device. The schema string is
// byte-identical to ROPE_SCHEMA in tools/qpool_export/qpool_export/flux_transformer.py (a unit
// test compares them).
inline constexpr char kRopeSchema[] = "rope(Tensor x, Tensor cos, Tensor sin) -> Tensor";

// Calls qpool::rope through the dispatcher (CPU or CUDA kernel by x's device).
at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The CPU kernel: the ATen operations of diffusers' apply_rotary_emb (the reference).
at::Tensor RopeCpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Throws c10::Error naming the argument unless x is [B, N, H, D] float32 / float16 / bfloat16
// with D even and cos and sin are float32 [1, N, 1, D] on x's device.
void CheckRopeArgs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Note [Normed rotary embedding op]
// rms_rope(xs, weights, eps, cos, sin) is rope(cat([rms_norm(x_i, [D], weight_i, eps)], dim 1),
// cos, sin): FLUX's q (or k) of each stream RMS-normed per head with the stream's own weight,
// the streams joined along the tokens (text first, the tables' order) and rotated. Unfused that
// is an RMS norm kernel per stream over rows of only D values (with a contiguous copy first: q
// and k are views of one projection's output), a concatenation and the rotation, each reading
// and writing all of q, and norms over rows that short are slow for their bytes (the profile in
// bench/results/README.md, FLUX on one H200). The CUDA kernel gives each head vector one
// warp, reads it once from any view whose last dimension is contiguous, and writes the joined,
// rotated result once. Each x_i is [B, N_i, H, D] of one float dtype, D even; each weight_i [D];
// cos and sin float32 [1, sum N_i, 1, D]. The norm rounds to x's dtype, as aten::rms_norm does,
// before the rotation, so the CPU form (the ATen operations) equals the unfused graph exactly
// and the CUDA kernel equals it but for the order of the norm's sum. The schema string is
// byte-identical to RMS_ROPE_SCHEMA in tools/qpool_export/qpool_export/flux_transformer.py.
inline constexpr char kRmsRopeSchema[] =
    "rms_rope(Tensor[] xs, Tensor[] weights, float eps, Tensor cos, Tensor sin) -> Tensor";

// Calls qpool::rms_rope through the dispatcher.
at::Tensor RmsRope(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                   const at::Tensor& sin);

// The CPU kernel: aten::rms_norm of each part, aten::cat, then RopeCpu (the reference).
at::Tensor RmsRopeCpu(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                      const at::Tensor& sin);

// Throws c10::Error naming the argument unless xs is one or more [B, N_i, H, D] tensors of one
// float dtype, B, H and D alike, D even, weights one [D] float tensor per part, eps >= 0, and
// cos and sin float32 [1, sum N_i, 1, D]; all on one device.
void CheckRmsRopeArgs(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                      const at::Tensor& sin);

}  // namespace qpool::quant
