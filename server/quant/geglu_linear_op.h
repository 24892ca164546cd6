// The qpool::geglu_quant_linear operator: a UNet feed-forward's GEGLU and its output linear in one
// call (Note [GEGLU linear op]); registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "quant/quant_format.h"

namespace qpool::quant {

// Note [GEGLU linear op]
// geglu_quant_linear(x [..., 2D], state, bias) is quant_linear(geglu(x), state, bias): the
// GEGLU (Note [GEGLU op]) and the feed-forward's output linear of a transformer block, which
// reads nothing else. One op so that a w8a8 layer can quantize its input rows while computing
// them (Note [GEGLU rows]): the GEGLU's output is never stored, and one pass over x replaces
// the GEGLU's and the quantizing pass's. The values are the two ops' bit for bit on every device
// and format: the CPU and Meta kernels, and the CUDA one wherever the fused rows do not run, are
// the two ops; the fused rows are LaunchW8A8QuantizeRows's of LaunchGeglu's output, byte for
// byte (GPU test). The exporter emits it for w8a8 output linears only (qpool_export's
// fuse_geglu_linears), after calibration and the layer errors, which see plain linears. The
// linear's tensors stay the module's own, so streaming (Note [Streaming]) brings them in with its
// forward. The schema string is byte-identical to GEGLU_QUANT_LINEAR_SCHEMA in
// tools/qpool_export/qpool_export/quant.py (a unit test compares them).
inline constexpr char kGegluQuantLinearSchema[] =
    "geglu_quant_linear(Tensor x, Tensor weight, Tensor absmax, Tensor code, Tensor "
    "nested_absmax, Tensor nested_code, Tensor offset, Tensor? bias) -> Tensor";

// Calls qpool::geglu_quant_linear through the dispatcher.
at::Tensor GegluQuantLinear(const at::Tensor& x, const QuantState& state,
                            const std::optional<at::Tensor>& bias = std::nullopt);

// Checks x as qpool::geglu does and its value half against the state as qpool::quant_linear does
// (devices included); returns the linear's layout.
QuantLayout CheckGegluQuantLinearArgs(const at::Tensor& x, const QuantState& state,
                                      const std::optional<at::Tensor>& bias);

}  // namespace qpool::quant
