// qpool::swiglu on CUDA (Note [SwiGLU op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/halves_rows.h"
#include "quant/quant_linear_cuda.h"
#include "quant/swiglu_kernels.h"
#include "quant/swiglu_op.h"

namespace qpool::quant {
namespace {

at::Tensor SwigluCuda(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  CheckSwigluArgs(x, weight);
  const at::ScalarType type = x.scalar_type();
  if (!HasElemType(type)) return SwigluCpu(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  const HalvesRows h = PrepareHalves(x);
  if (h.rows == 0) return h.out;
  const at::Tensor w = weight.has_value() ? weight->reshape({h.rows}).contiguous() : at::Tensor();
  cuda::LaunchSwiglu(h.x2.data_ptr(), h.x2.stride(0), w.defined() ? w.data_ptr() : nullptr, h.rows,
                     h.d, h.out.data_ptr(), ElemTypeOf(type), at::cuda::getCurrentCUDAStream());
  return h.out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("swiglu", &qpool::quant::SwigluCuda); }
