// qpool::rope on CUDA (Note [Rotary embedding op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/quant_linear_cuda.h"
#include "quant/rope_kernels.h"
#include "quant/rope_op.h"

namespace qpool::quant {
namespace {

at::Tensor RopeCuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  CheckRopeArgs(x, cos, sin);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor c = cos.reshape({x.size(1), x.size(3)}).contiguous();
  const at::Tensor s = sin.reshape({x.size(1), x.size(3)}).contiguous();
  at::Tensor out = at::empty_like(xc);
  cuda::LaunchRope(xc.data_ptr(), c.data_ptr<float>(), s.data_ptr<float>(), x.size(0), x.size(1),
                   x.size(2), x.size(3), out.data_ptr(), ElemTypeOf(x.scalar_type()),
                   at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("rope", &qpool::quant::RopeCuda); }
