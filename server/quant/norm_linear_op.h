// The qpool::layer_norm_quant_linear and qpool::add_layer_norm_quant_linear operators: a UNet
// transformer block's LayerNorm and the one linear that reads its output, in one call (Note [Norm
// linear op]); registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "quant/quant_format.h"

namespace qpool::quant {

// Note [Norm linear op]
// layer_norm_quant_linear(x, norm_weight, norm_bias, eps, state, bias) is
// quant_linear(layer_norm(x, norm_weight, norm_bias, eps), state, bias), and
// add_layer_norm_quant_linear(x, residual, ...) returns (s, quant_linear(n)) for (s, n) =
// add_layer_norm(x, residual, ...) (Note [Residual layer norm]): the block's norm1 with the fused
// self-attention projection, norm2 with the cross-attention's query, norm3 with the feed-forward's
// projection, each the only reader of its norm's output. One op so that a w8a8 layer's rows are
// quantized by the warp that norms them (Note [Quantized norm rows] in layer_norm_kernels.cu):
// the normed rows are never stored and the quantizing pass is gone. The values are the two ops'
// bit for bit on every device and format: the CPU and Meta kernels, and the CUDA one wherever
// the quantized rows do not run, are the two ops (GPU test for the rest). The exporter emits them
// for w8a8 linears only (qpool_export's fuse_norm_linears), after calibration and the layer
// errors, as one module that holds the norm's weight and bias (norm_weight, norm_bias) beside the
// linear's tensors: each module reads only its own tensors, as streaming (Note [Streaming])
// requires. The schema strings are byte-identical to LAYER_NORM_QUANT_LINEAR_SCHEMA and
// ADD_LAYER_NORM_QUANT_LINEAR_SCHEMA in tools/qpool_export/qpool_export/quant.py (a unit test
// compares them).
inline constexpr char kLayerNormQuantLinearSchema[] =
    "layer_norm_quant_linear(Tensor x, Tensor norm_weight, Tensor norm_bias, float eps, Tensor "
    "weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor nested_code, Tensor offset, "
    "Tensor? bias) -> Tensor";
inline constexpr char kAddLayerNormQuantLinearSchema[] =
    "add_layer_norm_quant_linear(Tensor x, Tensor residual, Tensor norm_weight, Tensor norm_bias, "
    "float eps, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor "
    "nested_code, Tensor offset, Tensor? bias) -> (Tensor, Tensor)";

// Call the operators through the dispatcher.
at::Tensor LayerNormQuantLinear(const at::Tensor& x, const at::Tensor& norm_weight,
                                const at::Tensor& norm_bias, double eps, const QuantState& state,
                                const std::optional<at::Tensor>& bias = std::nullopt);
std::tuple<at::Tensor, at::Tensor> AddLayerNormQuantLinear(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& norm_weight,
    const at::Tensor& norm_bias, double eps, const QuantState& state,
    const std::optional<at::Tensor>& bias = std::nullopt);

// Checks the norm's arguments as qpool::layer_norm does (CheckLayerNormArgs; residual null for
// layer_norm_quant_linear) and the linear's against x as qpool::quant_linear does, devices
// included; returns the linear's layout. `op` names the operator in the messages.
QuantLayout CheckNormQuantLinearArgs(const char* op, const at::Tensor& x,
                                     const at::Tensor* residual, const at::Tensor& norm_weight,
                                     const at::Tensor& norm_bias, double eps,
                                     const QuantState& state,
                                     const std::optional<at::Tensor>& bias);

// The two ops in turn through the dispatcher, for arguments checked by the caller: (x + residual
// or undefined without one, the linear's output). The CPU kernels, and the CUDA ones wherever
// the quantized rows do not run.
std::tuple<at::Tensor, at::Tensor> NormThenQuantLinear(const at::Tensor& x,
                                                       const at::Tensor* residual,
                                                       const at::Tensor& norm_weight,
                                                       const at::Tensor& norm_bias, double eps,
                                                       const QuantState& state,
                                                       const std::optional<at::Tensor>& bias);

}  // namespace qpool::quant
