// qpool::layer_norm and qpool::add_layer_norm on CUDA (Note [Residual layer norm]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/layer_norm_kernels.h"
#include "quant/layer_norm_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

// Runs the kernel into `out` (and `sum` where residual is given); false where it declines.
bool RunKernel(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight,
               const at::Tensor& bias, double eps, at::Tensor* sum, const at::Tensor& out) {
  const at::Tensor xc = x.contiguous();
  const at::Tensor rc = residual ? residual->contiguous() : at::Tensor();
  const at::Tensor w = weight.contiguous();
  const at::Tensor b = bias.contiguous();
  cuda::LayerNormArgs args;
  args.x = xc.data_ptr();
  args.residual = residual ? rc.data_ptr() : nullptr;
  args.weight = w.data_ptr();
  args.bias = b.data_ptr();
  args.sum = sum ? sum->data_ptr() : nullptr;
  args.out = out.data_ptr();
  args.d = x.size(-1);
  args.rows = args.d == 0 ? 0 : x.numel() / args.d;
  args.eps = static_cast<float>(eps);
  args.type = ElemTypeOf(x.scalar_type());
  return cuda::LaunchLayerNorm(args, at::cuda::getCurrentCUDAStream());
}

at::Tensor LayerNormCuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         double eps) {
  CheckLayerNormArgs("qpool::layer_norm", x, nullptr, weight, bias, eps);
  if (!HasElemType(x.scalar_type())) return LayerNormCpu(x, weight, bias, eps);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (!RunKernel(x, nullptr, weight, bias, eps, nullptr, out)) {
    return LayerNormCpu(x, weight, bias, eps);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormCuda(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps) {
  CheckLayerNormArgs("qpool::add_layer_norm", x, &residual, weight, bias, eps);
  if (!HasElemType(x.scalar_type())) return AddLayerNormCpu(x, residual, weight, bias, eps);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor sum = at::empty(x.sizes(), x.options());
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (!RunKernel(x, &residual, weight, bias, eps, &sum, out)) {
    return AddLayerNormCpu(x, residual, weight, bias, eps);
  }
  return {sum, out};
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) {
  m.impl("layer_norm", &qpool::quant::LayerNormCuda);
  m.impl("add_layer_norm", &qpool::quant::AddLayerNormCuda);
}
