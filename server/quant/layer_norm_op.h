// The qpool::layer_norm and qpool::add_layer_norm operators: a UNet transformer block's LayerNorms,
// the second and third with the residual addition before them, in one pass each (Note [Residual
// layer norm]); registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace qpool::quant {

// Note [Residual layer norm]
// A transformer block of an SD 1.x / 2.x or SDXL UNet (diffusers' BasicTransformerBlock) norms
// its token stream three times, each norm right after a residual addition:
//   x = x + attn1(norm1(x));  x = x + attn2(norm2(x), text);  x = x + ff(norm3(x)).
// Unfused, each addition reads two streams and writes one, and aten::layer_norm reads the sum
// again, on the rows of 320 to 1280 values these blocks norm at a fraction of the addition's
// bytes per second (bench/results/README.md has the profile). add_layer_norm(x,
// residual, weight, bias, eps) returns (x + residual, layer_norm(x + residual)): the block's
// norm2 and norm3 (blocks.py's ResidualLayerNorm) take the addition before them, and the sum
// goes on as the block's stream. layer_norm(x, weight, bias, eps) is the same kernel without the
// addition (norm1, whose input comes from the block before). The CUDA kernel gives each row one
// warp, which reads x and the residual once, writes the sum once, keeps the row in registers for
// the mean and then the variance about it, and writes the normed row once.
//
// The rounding points are the unfused operations': the sum rounded to the dtype, the norm
// gamma * (rstd * (v - mean)) + beta in float32 (aten::layer_norm's expression) rounded. The
// sum is therefore ATen's bit for bit; the norm's mean and variance are summed in another order
// than aten::layer_norm's Welford, so its output can differ from ATen's in the last bit. x,
// residual, weight and bias share one floating dtype and device; weight and bias are [D] for D
// = x.size(-1); outputs are contiguous. The kernel takes float32, float16 and bfloat16 rows of
// up to 2048 values (1024 in float32) whose width is a multiple of 16 bytes; anything else, and
// the CPU, runs the ATen operations. The schema strings are byte-identical to
// LAYER_NORM_SCHEMA and ADD_LAYER_NORM_SCHEMA in tools/qpool_export/qpool_export/blocks.py (a
// unit test compares them).
inline constexpr char kLayerNormSchema[] =
    "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor";
inline constexpr char kAddLayerNormSchema[] =
    "add_layer_norm(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) -> "
    "(Tensor, Tensor)";

// Call the operators through the dispatcher.
at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps);
std::tuple<at::Tensor, at::Tensor> AddLayerNorm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                double eps);

// The CPU kernels: aten::layer_norm over the last dimension, after aten::add for AddLayerNorm
// (the references; on any device).
at::Tensor LayerNormCpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        double eps);
std::tuple<at::Tensor, at::Tensor> AddLayerNormCpu(const at::Tensor& x, const at::Tensor& residual,
                                                   const at::Tensor& weight, const at::Tensor& bias,
                                                   double eps);

// Throws c10::Error naming the argument unless x is a floating-point tensor with at least one
// dimension, residual (when given) has x's sizes, weight and bias are [x.size(-1)], all share
// x's dtype and device, and eps >= 0. `op` names the operator in the message.
void CheckLayerNormArgs(const char* op, const at::Tensor& x, const at::Tensor* residual,
                        const at::Tensor& weight, const at::Tensor& bias, double eps);

}  // namespace qpool::quant
