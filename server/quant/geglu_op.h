// The qpool::geglu operator: the gated GELU of a UNet transformer block's feed-forward in one pass
// (Note [GEGLU op]); registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

namespace qpool::quant {

// Note [GEGLU op]
// geglu(x [..., 2D]) is x[..., :D] * gelu(x[..., D:]) with the exact (erf) GELU: the feed-forward
// of every transformer block of an SD 1.x / 2.x or SDXL UNet (diffusers' GEGLU) between its two
// linears. Unfused, the chunk leaves two views whose rows are not contiguous, so ATen's GELU and
// its product run the element-by-element strided path: the GELU reads the gate and writes a copy,
// the product reads the value and that copy and writes the output, five passes over D values per
// row (among the largest elementwise kernels of a profiled SDXL UNet, bench/results/README.md).
// The CUDA kernel reads value and gate once, 16 bytes at a time where the width, the
// row stride and the addresses allow, and writes the output once. It rounds as the unfused
// operations do: the GELU is ATen's formula in float32 (x / 2 (1 + erf(x / sqrt(2)))) cast to the
// dtype, and the product is taken in float32 and cast, so the results are the unfused ones bit
// for bit where the CUDA math library's erff is ATen's. x is floating-point with an even last
// dimension; the CPU kernel, and the CUDA one for dtypes other than float32, float16 and
// bfloat16 (a component placed in float64), are the unfused ATen operations. The schema string is
// byte-identical to GEGLU_SCHEMA in tools/qpool_export/qpool_export/blocks.py (a unit test
// compares them).
inline constexpr char kGegluSchema[] = "geglu(Tensor x) -> Tensor";

// Calls qpool::geglu through the dispatcher.
at::Tensor Geglu(const at::Tensor& x);

// The CPU kernel: chunk, aten::gelu of the gate, aten::mul (the reference; on any device).
at::Tensor GegluCpu(const at::Tensor& x);

// Throws c10::Error unless x is a floating-point tensor, at least 1-D, whose last dimension is
// even.
void CheckGegluArgs(const at::Tensor& x);

}  // namespace qpool::quant
