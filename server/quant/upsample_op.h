// The qpool::upsample_nearest operator: a UNet's or VAE decoder's nearest-neighbour upsampling
// that keeps a channels-last map channels-last, doubling it in one vectorized pass (Note
// [Upsample op]); registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace qpool::quant {

// Note [Upsample op]
// upsample_nearest(x [N, C, H, W], like) is F.interpolate(x, size=like.shape[2:],
// mode="nearest"), or with scale_factor=2 when `like` is None: every UNet upsampler resizes to
// the next skip connection's size (twice x's, or one less where a size was odd on the way
// down), every VAE decoder upsampler doubles. Its output has ATen's layout: x's suggested memory
// format (for a map of one pixel, whose strides fit both, the one its strides suggest). In the
// exports these maps are channels-last (Note [Channels-last convolutions] in
// component/component.h), where ATen's kernel gives each thread one output value and computes its
// source pixel in float arithmetic: several times the memory traffic's time
// (bench/results/README.md). The CUDA kernel
// doubles a dense channels-last float32, float16 or bfloat16 map whose channel rows are a
// multiple of 16 bytes with each thread copying 16 bytes of one input pixel to the four output
// pixels; anything else (other sizes, NCHW, odd widths, float64, the CPU) runs ATen's
// upsampling. The values are copies either way: the results are the same bits. The schema
// string is byte-identical to UPSAMPLE_SCHEMA in tools/qpool_export/qpool_export/blocks.py (a
// unit test compares them).
inline constexpr char kUpsampleSchema[] = "upsample_nearest(Tensor x, Tensor? like) -> Tensor";

// Calls qpool::upsample_nearest through the dispatcher.
at::Tensor UpsampleNearest(const at::Tensor& x, const std::optional<at::Tensor>& like);

// The CPU kernel: ATen's nearest upsampling to like's height and width (twice x's without it), in
// x's layout (the reference; on any device).
at::Tensor UpsampleNearestCpu(const at::Tensor& x, const std::optional<at::Tensor>& like);

// Throws c10::Error unless x is a 4-d floating-point tensor and `like`, when given, has 4
// dimensions with a height and width of at least one.
void CheckUpsampleArgs(const at::Tensor& x, const std::optional<at::Tensor>& like);

// The output's height and width: like's, or twice x's.
std::pair<int64_t, int64_t> UpsampledSize(const at::Tensor& x,
                                          const std::optional<at::Tensor>& like);

}  // namespace qpool::quant
