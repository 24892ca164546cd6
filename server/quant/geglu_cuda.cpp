// qpool::geglu on CUDA (Note [GEGLU op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "quant/geglu_kernels.h"
#include "quant/geglu_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

at::Tensor GegluCuda(const at::Tensor& x) {
  CheckGegluArgs(x);
  const at::ScalarType type = x.scalar_type();
  if (!HasElemType(type)) return GegluCpu(x);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t d = x.size(-1) / 2;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = d;
  at::Tensor out = at::empty(sizes, x.options());
  const int64_t rows = d == 0 ? 0 : out.numel() / d;
  if (rows == 0) return out;
  // x as [rows, 2D] with contiguous rows: a view where its leading dimensions allow one.
  at::Tensor x2 = x.reshape({rows, 2 * d});
  if (x2.stride(1) != 1) x2 = x2.contiguous();
  cuda::LaunchGeglu(x2.data_ptr(), x2.stride(0), rows, d, out.data_ptr(), ElemTypeOf(type),
                    at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("geglu", &qpool::quant::GegluCuda); }
