// Quantizer: float weight -> QuantState (int8, w8a8, nf4, nf4 + double quant) and back, with ATen
// operations that match tools/qpool_export/qpool_export/quant.py byte for byte.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "quant/quant_format.h"
#include "util/status.h"

namespace qpool::quant {

// How to quantize one weight.
struct QuantOptions {
  QuantFormat format = QuantFormat::kNone;
  int64_t blocksize = 64;     // nf4 only: bitsandbytes' default, a good size/accuracy trade-off
  bool double_quant = false;  // nf4 only: absmax stored as 8 bits (saves ~0.37 bit per weight)
};

// Symmetric per-row int8 of a floating [N, K] weight (Note [Quantized weight layouts]).
// InvalidArgument for a non-2-D or non-floating weight; `name` prefixes messages.
StatusOr<QuantState> QuantizeInt8(const at::Tensor& weight, const std::string& name = "weight");

// W8A8 of a floating [N, K] weight: QuantizeInt8 of weight * smooth (column-wise), with smooth
// as the state's code (Note [Quantized weight layouts]). An undefined smooth means ones (no
// calibration; weight and absmax are then QuantizeInt8's bytes). InvalidArgument for a bad
// weight, or a smooth that is not K positive finite values.
StatusOr<QuantState> QuantizeW8A8(const at::Tensor& weight, const at::Tensor& smooth = {},
                                  const std::string& name = "weight");

// Block-wise NF4 of a floating [N, K] weight, computed on the weight's device in row chunks so
// temporaries stay small. InvalidArgument for a bad blocksize or weight, naming `name`.
StatusOr<QuantState> QuantizeNf4(const at::Tensor& weight, int64_t blocksize, bool double_quant,
                                 const std::string& name = "weight");

// Dispatches on options.format (w8a8 with smooth = ones); kNone returns the weight unchanged
// with empty state.
StatusOr<QuantState> Quantize(const at::Tensor& weight, const QuantOptions& options,
                              const std::string& name = "weight");

// The [N, in_features] weight a state stands for, in `dtype` (computed in float32, then cast).
// Throws c10::Error on an inconsistent state.
at::Tensor Dequantize(const QuantState& state, int64_t in_features,
                      at::ScalarType dtype = at::kFloat);

// The float32 absmax per nf4 block (undoes double quantization), shape [nblocks].
at::Tensor Nf4BlockAbsmax(const QuantState& state);

// Index of the nearest value of the ascending `code` for every element of float32 `x`
// (ties to the lower index), as int64. Used for both NF4 nibbles and nested absmax bytes.
at::Tensor NearestCodeIndex(const at::Tensor& x, const at::Tensor& code);

// Symmetric int8 of the rows of float32 [R, C] x given their largest |value|, absmax float32
// [R]: clamp(round_half_even(x / absmax * 127), -127, 127); a row whose absmax is 0 gives zeros
// (it is divided by 1). Weights (int8, w8a8) and w8a8 activations are quantized by it.
at::Tensor RowsToInt8(const at::Tensor& x, const at::Tensor& absmax);

// float32 t / 127, correctly rounded on every device: divided by a tensor on t's device, since
// ATen's CUDA division by a host scalar multiplies by its reciprocal (Note [Fused W8A8 kernels]).
at::Tensor DivideBy127(const at::Tensor& t);

// Bytes of the tensors of a state (weight + quant state).
int64_t StateBytes(const QuantState& state);

}  // namespace qpool::quant
