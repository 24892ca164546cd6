// W8A8Linear: the w8a8 format's product, int8 activations quantized per row at run time times
// int8 weights with int32 accumulation, in ATen operations shared by the CPU kernel and the
// CUDA dispatch of qpool::quant_linear.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "quant/quant_format.h"

namespace qpool::quant {

// Note [W8A8 linear]
// A w8a8 layer (Note [Quantized weight layouts]: int8 weight [N, K], absmax float32 [N], code =
// activation scales s float32 [K]) computes, for x [..., K] viewed as M rows:
//   xs  = x / s                                   (float32)
//   a_r = max_k |xs[r, k]|                        (float32, per row r: "per token")
//   q   = clamp(round_half_even(xs / a_r * 127), -127, 127)   int8 (RowsToInt8: a row with
//         a_r = 0 is divided by 1, so q = 0, and its output is the bias alone)
//   acc = q @ weight^T                            (int32, exact: at::_int_mm)
//   y   = acc * (a_r / 127) * (absmax_n / 127) + bias   (float32, each product rounded), cast to
//         x's dtype.
// at::_int_mm on CUDA (LibTorch 2.11, cuBLASLt int8 tensor cores) refuses M <= 16 and K or N
// that are not positive multiples of 8. Where W8A8IntMatmulRuns() says no, on every device
// alike (the CPU's _int_mm has no such limits, but one rule keeps CPU and CUDA results the
// same), the layer falls back to weight-only int8: the int8 op (Note [CPU quant_linear], or the
// CUDA int8 kernels with their path choice) applied to xs cast to x's dtype, with the same
// weight, absmax and bias. With s = ones (every load-time quantization) that is exactly the int8
// format's output. Small M is where the weight-only kernels are fastest anyway (Note [Small-M
// path choice]). tools/qpool_export/qpool_export/quant.py computes the same values with the
// same tensor operations (tests/python/test_quant.py checks the C++ op against it).
// W8A8Linear is ATen (device-agnostic, no host synchronisation, so CUDA-graph capturable:
// Note [Capture-safe kernels]), the CPU's form. On CUDA, where the int8 product runs, two fused
// kernels quantize x and scale the product around at::_int_mm with the same values (Note
// [Fused W8A8 kernels]); a GEMM that quantizes in its prologue and scales in its epilogue (no
// int32 [M, N] round trip) could later replace all three.

// Smallest number of rows (M) for which at::_int_mm runs on CUDA; K and N must be multiples of
// kW8A8Multiple.
inline constexpr int64_t kW8A8MinRows = 17;
inline constexpr int64_t kW8A8Multiple = 8;

// Whether the int8 x int8 product runs for `rows` rows of x (else the weight-only fallback).
bool W8A8IntMatmulRuns(int64_t rows, int64_t in_features, int64_t out_features);

// The weight-only int8 linear of a device: y = x W^T + b for an int8 state, in x's dtype.
using WeightOnlyLinear = std::function<at::Tensor(const at::Tensor& x, const QuantState& int8_state,
                                                  const std::optional<at::Tensor>& bias)>;

// The w8a8 product of Note [W8A8 linear] for x [..., K] and a state whose layout is w8a8 (the
// caller has checked devices and arguments); `weight_only` computes the fallback.
at::Tensor W8A8Linear(const at::Tensor& x, const QuantState& state,
                      const std::optional<at::Tensor>& bias, const WeightOnlyLinear& weight_only);

}  // namespace qpool::quant
