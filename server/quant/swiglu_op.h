// The qpool::swiglu operator: the gated SiLU of a SwiGLU feed-forward between its two linears, with
// an optional per-row weight, in one pass (Note [SwiGLU op]); registered with the dispatcher for
// CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace qpool::quant {

// Note [SwiGLU op]
// swiglu(x [..., 2D], weight [...]?) is silu(x[..., :D]) * x[..., D:], times weight[..., None]
// where a weight is given: the feed-forward of HiDream's blocks and of their routed experts
// (w2(silu(w1 x) * w3 x), w1 and w3 fused into one linear, Note [Fused projections]), the weight
// being the gate's weight of each token routed to the expert (Note [Routed experts]), applied
// before w2 instead of after it (w2 is linear). Unfused, the SiLU writes a copy of the gate half
// that the product reads back, and the routed experts' weighting is one more pass over their
// outputs: the SiLU and the products were a large share of a HiDream step's kernel time
// (bench/results/README.md). The CUDA kernel reads each row's gate and value once (16 bytes at a
// time where the width, row stride and addresses allow) and writes the output once. It rounds
// as the unfused operations do, each step's float32 result cast to the dtype: the SiLU
// (x / (1 + exp(-x)), ATen's formula), the product, the weighting; so the results are the
// unfused ones bit for bit where the CUDA math library's expf is ATen's. x is floating-point with
// an even last dimension; the weight, if any, has x's dtype, device and leading shape. The CPU
// kernel, and the CUDA one for dtypes without a kernel (float64), are the ATen operations. The
// schema string is byte-identical to SWIGLU_SCHEMA in
// tools/qpool_export/qpool_export/hidream_experts.py (a unit test compares them).
inline constexpr char kSwigluSchema[] = "swiglu(Tensor x, Tensor? weight) -> Tensor";

// Calls qpool::swiglu through the dispatcher.
at::Tensor Swiglu(const at::Tensor& x, const std::optional<at::Tensor>& weight);

// The CPU kernel: chunk, aten::silu of the gate half, aten::mul, aten::mul by weight[..., None]
// (the reference; on any device).
at::Tensor SwigluCpu(const at::Tensor& x, const std::optional<at::Tensor>& weight);

// Throws c10::Error unless x is a floating-point tensor, at least 1-D, whose last dimension is
// even, and weight, if given, has x's dtype and device and the shape x.shape[:-1].
void CheckSwigluArgs(const at::Tensor& x, const std::optional<at::Tensor>& weight);

}  // namespace qpool::quant
