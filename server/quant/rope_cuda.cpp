// qpool::rope and qpool::rms_rope on CUDA (Notes [Rotary embedding op], [Normed rotary embedding
// op]).
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

at::Tensor RmsRopeCuda(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                       const at::Tensor& sin) {
  CheckRmsRopeArgs(xs, weights, eps, cos, sin);
  const at::Tensor& first = xs[0];
  const int64_t rows = first.size(0), heads = first.size(2), d = first.size(3);
  const int64_t tokens = cos.size(1);
  // Head sizes past the kernel's registers: the ATen operations, on the GPU.
  if (d > cuda::kRmsRopeMaxD) return RmsRopeCpu(xs, weights, eps, cos, sin);
  const c10::cuda::CUDAGuard guard(first.device());
  const at::Tensor c = cos.reshape({tokens, d}).contiguous();
  const at::Tensor s = sin.reshape({tokens, d}).contiguous();
  at::Tensor out = at::empty({rows, tokens, heads, d}, first.options());
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    // Any view whose channels are contiguous is read in place (q and k are views of one
    // projection's output).
    const at::Tensor x = xs[i].stride(3) == 1 ? xs[i] : xs[i].contiguous();
    const at::Tensor w = weights[i].to(x.scalar_type()).contiguous();
    const cuda::RmsRopePart part{x.data_ptr(), x.stride(0), x.stride(1), x.stride(2),
                                 w.data_ptr(), x.size(1),   offset};
    cuda::LaunchRmsRope(part, static_cast<float>(eps), c.data_ptr<float>(), s.data_ptr<float>(),
                        rows, tokens, heads, d, out.data_ptr(), ElemTypeOf(x.scalar_type()),
                        at::cuda::getCurrentCUDAStream());
    offset += x.size(1);
  }
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) {
  m.impl("rope", &qpool::quant::RopeCuda);
  m.impl("rms_rope", &qpool::quant::RmsRopeCuda);
}
