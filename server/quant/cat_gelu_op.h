// The qpool::cat_gelu operator: the end of FLUX's single-stream block, the attention output and
// the GELU of the MLP branch joined for the output projection, in one pass (Note [Joined GELU
// op]); registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

namespace qpool::quant {

// Note [Joined GELU op]
// cat_gelu(a [..., Da], b [..., Db]) is cat([a, gelu(b, approximate="tanh")], -1): a
// single-stream block joins its attention output with the tanh-approximated GELU of its MLP
// branch before one output projection (diffusers' FluxSingleTransformerBlock). Unfused, the GELU
// reads b, a view of the fused q / k / v / MLP projection's output whose rows are not contiguous,
// element by element and writes a copy that the concatenation reads again; the CUDA kernel reads
// a and b once, 16 bytes at a time where the widths, the row strides and the addresses allow,
// and writes the joined rows once. The GELU is ATen's formula in float32 (0.5 x (1 + tanh(
// sqrt(2 / pi) (x + 0.044715 x^3)))), cast to the inputs' dtype. a and b are float32, float16 or
// bfloat16 of one dtype, with the same leading sizes, on one device. The CPU kernel is the
// unfused ATen operations. The schema string is byte-identical to CAT_GELU_SCHEMA in
// tools/qpool_export/qpool_export/flux_transformer.py (a unit test compares them).
inline constexpr char kCatGeluSchema[] = "cat_gelu(Tensor a, Tensor b) -> Tensor";

// Calls qpool::cat_gelu through the dispatcher.
at::Tensor CatGelu(const at::Tensor& a, const at::Tensor& b);

// The CPU kernel: aten::gelu (tanh) of b, aten::cat (the reference).
at::Tensor CatGeluCpu(const at::Tensor& a, const at::Tensor& b);

// Throws c10::Error naming the argument unless a and b are float32 / float16 / bfloat16 tensors of
// one dtype, at least 1-D, with the same leading sizes, on one device.
void CheckCatGeluArgs(const at::Tensor& a, const at::Tensor& b);

}  // namespace qpool::quant
