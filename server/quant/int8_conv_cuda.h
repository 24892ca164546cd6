// Int8Conv2d: an int8 convolution with its scales and bias applied in one cuDNN graph, the
// product the w8a8 convolutions are built on (CUDA builds only).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace qpool::quant::cuda {

// Note [Int8 convolutions]
// A w8a8 convolution's activations are quantized with one scale for the whole batch, not per
// pixel: an output pixel sums over R x S input pixels, so per-pixel scales would not factor out of
// its sum. (Per-image scales would, but cuDNN's fused engines give wrong values for a factor
// broadcast per image, while they take per-channel ones.) The batch's scale is multiplied into the
// weight's per-channel scales, and the convolution is then one cuDNN operation graph:
//   acc[n, k, p] = sum over c, r, s of x[n, c, p + (r, s)] * weight[k, c, r, s]   (int32)
//   y[n, k, p]   = acc * (weight_scale[k] * x_scale) + bias[k]                    (float32)
// written once as fp16 or bf16. Activations, weights and output are NHWC (PyTorch's channels-last
// memory of logical NCHW tensors, the memory the UNets run in on CUDA). cuDNN's runtime-fusion
// engines compile the graph for the device; int8 with a float output and no fused epilogue has no
// tensor-core engine there, which is why the scales live in the graph and not in a second pass.
// One scale for a batch loses far more than the w8a8 linears' per-token scales (bench/results):
// which convolutions, if any, may take int8 inputs is measured before a model calls this.
//
// Plans are built once per (device, sizes, stride, padding, output dtype, bias) and cached for
// the process's life. The first call of a shape outside stream capture times the engine
// configurations that cuDNN's heuristics rank first on the caller's own tensors (one
// synchronization, as cudnn.benchmark does) and keeps the fastest; a first call under CUDA-graph
// capture takes the first configuration that builds, without timing, and the next call outside
// capture tunes it. Execution allocates its workspace through the caching allocator and launches
// on the current stream, as Note [Capture-safe kernels] asks; that cuDNN's runtime-fusion engines
// replay correctly inside a captured graph is still to be tested. A shape's first call compiles
// and times up to kTunedConfigs engine configurations, which takes seconds (bench/results): a
// model must make those calls before it serves.
//
// Thread safety: callable from any thread; the plan cache is guarded by its own mutex, held only
// to look up and insert (plans are built and tuned outside it, so two threads may both build the
// same shape once; the first stored wins).

// x: [N, C, H, W] int8, channels-last contiguous; x_scale: [1] float32; weight: [K, C, R, S]
// int8, channels-last contiguous; weight_scale: [K] float32; bias: [K] float32 or undefined.
// C and K multiples of 16; all on one CUDA device. Returns [N, K, Ho, Wo] of `out_dtype` (half
// or bfloat16) in channels-last memory. Wrong arguments throw c10::Error naming what is wrong;
// sizes no engine takes throw too (Int8ConvSupported says beforehand).
at::Tensor Int8Conv2d(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                      const at::Tensor& weight_scale, const at::Tensor& bias, int64_t stride,
                      int64_t padding, at::ScalarType out_dtype);

// Whether the arguments' sizes and dtypes are ones Int8Conv2d takes (checks only what needs no
// plan: dtypes, layouts, channel multiples, a device of compute capability 8.0 or newer).
bool Int8ConvSupported(const at::Tensor& x, const at::Tensor& weight, at::ScalarType out_dtype);

// Plans in the cache (tests).
int64_t Int8ConvCachedPlans();

}  // namespace qpool::quant::cuda
