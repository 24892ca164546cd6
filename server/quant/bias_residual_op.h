// The qpool::bias_residual operator: a convolution's bias and the residual added to its bias-free
// output in one pass (Note [Convolution biases]); registered with the dispatcher for CPU, CUDA
// and Meta.
#pragma once

#include <ATen/ATen.h>

namespace qpool::quant {

// Note [Convolution biases]
// ATen runs a cuDNN convolution without its bias and adds the bias afterwards in a broadcast
// pass of its own, which for channels-last output takes the element-by-element strided path:
// one pass over the feature map per convolution (a profiled SDXL UNet's count is in
// bench/results/README.md). The UNet and VAE decoder exports therefore give no convolution of a
// resnet block that feeds a later elementwise operation its bias to add, and fold the bias into
// that operation instead (blocks.py):
// - a resnet block's conv1 hands its bias to norm2's addition in qpool::group_norm (a vector of
//   [N, C] values, not a pass over the map): with the time embedding in a UNet, alone in a
//   decoder;
// - its conv2 adds its bias and the block's residual in qpool::bias_residual;
// - 1x1 convolutions (shortcuts, SD 1.x's transformer projections) run as linears over the
//   channels-last pixels, whose GEMM adds the bias in its epilogue.
// Each folded bias is read in its own module's forward, as streaming requires (Note
// [Streaming] in residency/stream_plan.h).
//
// bias_residual(x [N, C, ...], bias [C], residual like x) is residual + (x + bias), rounded as
// those two ATen additions are (each result cast to the dtype), so a channels-last fp16 UNet
// gets the bits of the separate bias pass and residual addition. The result has x's memory
// layout whatever the residual's (ATen's addition would follow the residual's): an AOTInductor
// package lays out what follows by the op's fake, empty_like(x). The CUDA kernel reads x and
// residual once and writes the sum once, 16 bytes at a time where the widths and addresses
// allow, for 4-d x and residual of float32, float16 or bfloat16 both dense channels-last (a
// UNet's) or both NCHW (the VAE decoder's); anything else, and the CPU, runs the two ATen
// additions. The schema string is byte-identical to BIAS_RESIDUAL_SCHEMA in
// tools/qpool_export/qpool_export/blocks.py (a unit test compares them).
inline constexpr char kBiasResidualSchema[] =
    "bias_residual(Tensor x, Tensor bias, Tensor residual) -> Tensor";

// Calls qpool::bias_residual through the dispatcher.
at::Tensor BiasResidual(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual);

// The CPU kernel: residual + (x + bias viewed as [1, C, 1, ...]) into a tensor laid out as x (the
// reference; on any device).
at::Tensor BiasResidualCpu(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual);

// Throws c10::Error unless x is floating-point with at least two dimensions, bias is [C] for C
// = x.size(1), residual has x's sizes, and all three share a dtype.
void CheckBiasResidualArgs(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual);

}  // namespace qpool::quant
