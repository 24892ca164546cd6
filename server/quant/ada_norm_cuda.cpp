// qpool::ada_norm on CUDA (Note [Modulated norm op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/ada_norm_kernels.h"
#include "quant/ada_norm_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

at::Tensor RowsContiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

at::Tensor AdaNormCuda(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                       double eps) {
  CheckAdaNormArgs(x, shift, scale, eps);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xr = RowsContiguous(x), sh = RowsContiguous(shift), sc = RowsContiguous(scale);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const bool launched = cuda::LaunchAdaNorm(
      xr.data_ptr(), xr.stride(0), xr.stride(1), sh.data_ptr(), sh.stride(0), sc.data_ptr(),
      sc.stride(0), x.size(0), x.size(1), x.size(2), static_cast<float>(eps), out.data_ptr(),
      ElemTypeOf(x.scalar_type()), at::cuda::getCurrentCUDAStream());
  // Rows wider than the kernel's registers: the ATen operations, on the GPU.
  return launched ? out : AdaNormCpu(x, shift, scale, eps);
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("ada_norm", &qpool::quant::AdaNormCuda); }
