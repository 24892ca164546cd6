// CUDA implementation of qpool::quant_linear: path selection between the fused small-M kernel
// and dequantize + cuBLAS, exposed for tests and benchmarks.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "quant/quant_format.h"
#include "quant/quant_kernels.h"

namespace qpool::quant {

// Which CUDA algorithm computes the product of an int8 or nf4 layer. w8a8 layers multiply in
// int8, through one warpgroup-MMA kernel on Hopper where it wins (Note [W8A8 product choice];
// kWgmma: wherever it runs) and through cuBLASLt otherwise (kIntMatmul: always), and use the
// chosen path only where they fall back to weight-only int8 (Note [W8A8 linear]).
enum class CudaPath {
  kAuto,           // kMma for fp16/bf16 x with M <= kMmaMaxRows when the layout allows it
                   // (int8 at M = 1: kFused) and for larger M on large layers (Note [Small-M
                   // path choice]), else fused for M <= kFusedMaxRows, otherwise dequantize +
                   // matmul
  kFused,          // fused dequantize-and-multiply kernel on CUDA cores (any M; small M)
  kMma,            // fused tensor-core kernel (fp16/bf16, any M; falls back to kAuto when
                   // the layout does not allow it: see cuda::MmaLinearSupported)
  kDequantMatmul,  // dequantize into a temporary [N, K] weight, then at::linear (cuBLAS)
  kWgmma,          // Hopper warpgroup-MMA kernel that dequantizes in its tile loop (fp16/bf16;
                   // falls back to kAuto where cuda::WgmmaLinearSupported says no)
  kIntMatmul,      // w8a8: cuBLASLt's int8 GEMM (at::_int_mm) between the fused quantize and
                   // epilogue kernels, even on Hopper; other formats: as kAuto
};

// The kernels' element type of float32, float16 and bfloat16 tensors; c10::Error otherwise.
cuda::ElemType ElemTypeOf(at::ScalarType t);

// Whether the kernels have an element type for t (ElemTypeOf's domain): the fused ops run their
// kernels on these dtypes and ATen's operations on any other.
inline bool HasElemType(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// Largest M (rows of x) the automatic choice sends to the CUDA-core fused kernel when the
// tensor-core kernel cannot run (float32 x, unaligned or padded layouts).
// Note [Fused kernel crossover]: the CUDA-core kernel's cost grows about linearly with M (no
// tensor cores): by M = 16 it is slower than both the tensor-core kernel and dequantize +
// cuBLAS on the large layers (bench/results/quant_linear.md).
inline constexpr int64_t kFusedMaxRows = 4;

// Whether the automatic choice runs the tensor-core kernel for M > kMmaMaxRows (Note [Small-M
// path choice]) on a layer of `in_features` x `out_features`.
bool MediumMmaWins(int64_t m, int64_t in_features, int64_t out_features);

// The tile the automatic choice runs the warpgroup-MMA kernel with (Note [Large-M path choice];
// sm_count left for the caller), or nothing where dequantize + cuBLAS measured faster.
std::optional<cuda::WgmmaTile> WgmmaWins(int64_t m, int64_t in_features, int64_t out_features,
                                         QuantFormat format, bool double_quant);

// Whether CudaPath::kWgmma runs the warpgroup-MMA kernel for x (CUDA, contiguous) and this state
// on the current device, rather than falling back.
bool WgmmaRuns(const at::Tensor& x, const QuantState& state);

// qpool::quant_linear on CUDA with an explicit algorithm, and for the small-M kernel optionally a
// forced block shape (tests and benchmarks); same checks as the op.
at::Tensor QuantLinearCuda(const at::Tensor& x, const QuantState& state,
                           const std::optional<at::Tensor>& bias, CudaPath path = CudaPath::kAuto,
                           cuda::MmaShape mma_shape = {});

// How the small-M kernel would run x (CUDA, M <= cuda::kMmaMaxRows) and this state on the
// current device with the automatic block shape.
cuda::MmaPlan MmaPlanFor(const at::Tensor& x, const QuantState& state);

// The dequantized [N, in_features] weight computed on the state's CUDA device, in `dtype`.
at::Tensor DequantizeCuda(const QuantState& state, int64_t in_features, at::ScalarType dtype);

}  // namespace qpool::quant
