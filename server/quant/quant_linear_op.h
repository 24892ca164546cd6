// The qpool::quant_linear operator: y = x W^T + b with W stored as none / int8 / nf4 (+ double
// quant) / w8a8, registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "quant/quant_format.h"

namespace qpool::quant {

// Note [quant_linear schema]
// The schema string is byte-identical to SCHEMA in tools/qpool_export/qpool_export/quant.py
// (a unit test compares them). It has no int arguments: the format and blocksize are derived
// from the tensors (Note [Quantized weight layouts]), so a traced graph is format-agnostic and
// load-time quantization only swaps the module's buffers. x is [..., K] float32/float16/bfloat16;
// the output is [..., N] in x's dtype, accumulated in float32. Every tensor, empty ones included,
// must be on x's device (the bitsandbytes "quant_state.code left on cuda:0" bug is an error here,
// naming the tensor and both devices, never a crash or a silent copy).
inline constexpr char kQuantLinearSchema[] =
    "quant_linear(Tensor x, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, "
    "Tensor nested_code, Tensor offset, Tensor? bias) -> Tensor";

// Calls qpool::quant_linear through the dispatcher (CPU or CUDA kernel by the inputs' device).
at::Tensor QuantLinear(const at::Tensor& x, const QuantState& state,
                       const std::optional<at::Tensor>& bias = std::nullopt);

// Throws c10::Error unless every tensor is defined and on x's device; the message names the
// tensor and both devices.
void CheckSameDevice(const at::Tensor& x, const QuantState& state,
                     const std::optional<at::Tensor>& bias);

// Checks x (floating, at least 1-D) and bias (N values) against the state; returns the layout.
QuantLayout CheckQuantLinearArgs(const at::Tensor& x, const QuantState& state,
                                 const std::optional<at::Tensor>& bias);

// Output shape: x's with the last dimension replaced by N.
std::vector<int64_t> QuantLinearOutputShape(const at::Tensor& x, int64_t out_features);

// The CPU kernel: dequantize to float32, linear in float32, cast to x's dtype; w8a8 layers
// multiply in int8 instead (Note [W8A8 linear]).
at::Tensor QuantLinearCpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& absmax,
                          const at::Tensor& code, const at::Tensor& nested_absmax,
                          const at::Tensor& nested_code, const at::Tensor& offset,
                          const std::optional<at::Tensor>& bias);

}  // namespace qpool::quant
