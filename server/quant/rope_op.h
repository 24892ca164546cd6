// The qpool::rope operator: FLUX's rotary position embedding of q or k in one pass, registered
// with the dispatcher for CPU, CUDA and Meta (Note [Rotary embedding op]).
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

}  // namespace qpool::quant
