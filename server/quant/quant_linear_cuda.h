// CUDA implementation of qpool::quant_linear: path selection between the fused small-M kernel
// and dequantize + cuBLAS, exposed for tests and benchmarks.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "quant/quant_format.h"

namespace qpool::quant {

// Which CUDA algorithm computes the product.
enum class CudaPath {
  kAuto,           // kMma for fp16/bf16 x with M <= kMmaMaxRows when the layout allows it
                   // (int8 at M = 1: kFused), else fused for M <= kFusedMaxRows, otherwise
                   // dequantize + matmul
  kFused,          // fused dequantize-and-multiply kernel on CUDA cores (any M; small M)
  kMma,            // fused tensor-core kernel (fp16/bf16, M <= 16; falls back to kAuto when
                   // the layout does not allow it: see cuda::MmaLinearSupported)
  kDequantMatmul,  // dequantize into a temporary [N, K] weight, then at::linear (cuBLAS)
};

// Largest M (rows of x) the automatic choice sends to the fused kernel.
// Note [Fused kernel crossover]: on an H100 (bench/results/quant_linear_h100.json) the fused
// kernel beats fp16 cuBLAS at M = 1 (int8 1.1-2.3x, nf4 up to 2.2x on most shapes) but its cost
// grows about linearly with M (x is re-read per output row, no tensor cores): at M = 16 it is
// 1.3-2.2x slower than dequantize + cuBLAS on the SDXL feed-forward and Flux layers and only
// wins on SD 1.5-sized ones. Interpolating the measured
// M = 1 and M = 16 times puts the crossover between M = 5 and 12 depending on the shape, so 4 is
// a conservative cut. A tensor-core (mma) kernel would move it up.
inline constexpr int64_t kFusedMaxRows = 4;

// qpool::quant_linear on CUDA with an explicit algorithm; same checks as the op.
at::Tensor QuantLinearCuda(const at::Tensor& x, const QuantState& state,
                           const std::optional<at::Tensor>& bias, CudaPath path = CudaPath::kAuto);

// The dequantized [N, in_features] weight computed on the state's CUDA device, in `dtype`.
at::Tensor DequantizeCuda(const QuantState& state, int64_t in_features, at::ScalarType dtype);

}  // namespace qpool::quant
