// The qpool::grouped_quant_linear operator: one linear per group of rows (a mixture's routed
// experts), the groups' weights stored as one quantized layer (Note [Grouped linear op]);
// registered with the dispatcher for CPU, CUDA and Meta.
#pragma once

#include <ATen/ATen.h>

#include "quant/quant_format.h"

namespace qpool::quant {

// Note [Grouped linear op]
// grouped_quant_linear(x [M, K], offs int32 [E], state) gives out [M, N]: rows offs[e - 1] ..
// offs[e] of x (offs[-1] = 0) times group e's weight W_e [N, K] transposed. The state is a
// QuantLinear's (Note [quant_linear schema]) for the E groups' weights stacked as one [E N, K]
// layer, so the exporter's and the server's quantizers (Note [Load-time quantization]) handle
// it as any layer, the mover and the accountant see its buffers, and a traced graph stays
// format-agnostic. offs is counted on the device and never read on the host: the op is CUDA-graph
// capturable (Note [Routed experts] in tools/qpool_export/qpool_export/hidream_experts.py), and
// its values are not checked: they must be ascending and end at M (rows past offs[E - 1] are
// left unspecified). The product is ATen's grouped matrix product (at::_grouped_mm): a float
// layer's in x's dtype; a quantized layer's weight dequantized into x's dtype on CUDA (as
// quant_linear's dequantize + matmul path), into float32 on the CPU with x cast to float32 and
// the result cast back (the CPU kernel is the reference, Note [CPU quant_linear]). w8a8 layers
// multiply their dequantized weight (weight-only int8 math). Every tensor must be on x's device.
// The schema string is byte-identical to GROUPED_QUANT_LINEAR_SCHEMA in
// tools/qpool_export/qpool_export/grouped_quant.py (a unit test compares them).
inline constexpr char kGroupedQuantLinearSchema[] =
    "grouped_quant_linear(Tensor x, Tensor offs, Tensor weight, Tensor absmax, Tensor code, "
    "Tensor nested_absmax, Tensor nested_code, Tensor offset) -> Tensor";

// Calls qpool::grouped_quant_linear through the dispatcher.
at::Tensor GroupedQuantLinear(const at::Tensor& x, const at::Tensor& offs, const QuantState& state);

// What the kernels need to know of a call's arguments.
struct GroupedLayout {
  QuantLayout layer;         // the stacked [E N, K] layer
  int64_t groups = 0;        // E
  int64_t out_features = 0;  // N
};

// Checks x (2-D floating), offs (int32 [E], E >= 1, on x's device) and the state (devices
// included; its rows a multiple of E); returns the layout.
GroupedLayout CheckGroupedQuantLinearArgs(const at::Tensor& x, const at::Tensor& offs,
                                          const QuantState& state);

// at::_grouped_mm of x with `weight`, the dequantized [E N, K] layer in x's dtype or float32,
// viewed as E [N, K] matrices; the result in x's dtype.
at::Tensor GroupedProduct(const at::Tensor& x, const at::Tensor& offs, const at::Tensor& weight,
                          const GroupedLayout& layout);

}  // namespace qpool::quant
