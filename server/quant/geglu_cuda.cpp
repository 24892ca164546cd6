// qpool::geglu on CUDA (Note [GEGLU op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/geglu_kernels.h"
#include "quant/geglu_op.h"
#include "quant/halves_rows.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

at::Tensor GegluCuda(const at::Tensor& x) {
  CheckGegluArgs(x);
  const at::ScalarType type = x.scalar_type();
  if (!HasElemType(type)) return GegluCpu(x);
  const c10::cuda::CUDAGuard guard(x.device());
  const HalvesRows h = PrepareHalves(x);
  if (h.rows == 0) return h.out;
  cuda::LaunchGeglu(h.x2.data_ptr(), h.x2.stride(0), h.rows, h.d, h.out.data_ptr(),
                    ElemTypeOf(type), at::cuda::getCurrentCUDAStream());
  return h.out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("geglu", &qpool::quant::GegluCuda); }
