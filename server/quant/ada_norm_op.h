// The qpool::ada_norm operator: FLUX's modulated LayerNorm (adaLN), the norm and the shift and
// scale in one pass (Note [Modulated norm op]); registered with the dispatcher for CPU, CUDA and
// Meta.
#pragma once

#include <ATen/ATen.h>

namespace qpool::quant {

// Note [Modulated norm op]
// ada_norm(x [B, N, D], shift [B, D], scale [B, D], eps) is
// addcmul(shift[:, None], layer_norm(x, [D], eps), 1 + scale[:, None]): every FLUX block norms
// its stream without affine parameters and modulates it with vectors of the timestep embedding
// (diffusers' AdaLayerNormZero, AdaLayerNormZeroSingle, AdaLayerNormContinuous and the
// feed-forwards' norms). Unfused, the norm writes the normed stream and the modulation reads it
// again; the CUDA kernel gives each row one block, holds the row in registers for the mean and
// the variance, and writes the modulated row once. The rounding points are the unfused graph's:
// the norm and 1 + scale rounded to x's dtype, then shift + normed * (1 + scale) in float32,
// rounded; the kernel's mean and variance are summed in another order than aten::layer_norm's.
// x, shift and scale are float32, float16 or bfloat16 of one dtype on one device, x's rows and
// shift's and scale's rows with contiguous values. The CPU kernel is the unfused ATen
// operations. The schema string is byte-identical to ADA_NORM_SCHEMA in
// tools/qpool_export/qpool_export/flux_transformer.py (a unit test compares them).
inline constexpr char kAdaNormSchema[] =
    "ada_norm(Tensor x, Tensor shift, Tensor scale, float eps) -> Tensor";

// Calls qpool::ada_norm through the dispatcher.
at::Tensor AdaNorm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                   double eps);

// The CPU kernel: aten::layer_norm, then aten::addcmul (the reference).
at::Tensor AdaNormCpu(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                      double eps);

// Throws c10::Error naming the argument unless x is [B, N, D] and shift and scale [B, D], of one
// float dtype (float32 / float16 / bfloat16) on one device, and eps >= 0.
void CheckAdaNormArgs(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                      double eps);

}  // namespace qpool::quant
