#include "quant/layer_norm_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace qpool::quant {

void CheckLayerNormArgs(const char* op, const at::Tensor& x, const at::Tensor* residual,
                        const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op, ": x must be floating-point, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  const int64_t d = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d, op, ": weight is ", weight.sizes(),
              ", x's rows have ", d, " values");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == d, op, ": bias is ", bias.sizes(),
              ", x's rows have ", d, " values");
  TORCH_CHECK(eps >= 0, op, ": eps is ", eps, "; it must be >= 0");
  const bool same = weight.scalar_type() == x.scalar_type() &&
                    bias.scalar_type() == x.scalar_type() &&
                    (residual == nullptr || residual->scalar_type() == x.scalar_type());
  if (residual == nullptr) {
    TORCH_CHECK(same, op, ": x, weight and bias must share a dtype, got ", x.scalar_type(), ", ",
                weight.scalar_type(), " and ", bias.scalar_type());
  } else {
    TORCH_CHECK(same, op, ": x, residual, weight and bias must share a dtype, got ",
                x.scalar_type(), ", ", residual->scalar_type(), ", ", weight.scalar_type(), " and ",
                bias.scalar_type());
  }
  const bool one_device = weight.device() == x.device() && bias.device() == x.device() &&
                          (residual == nullptr || residual->device() == x.device());
  TORCH_CHECK(one_device, op, ": x, ", residual ? "residual, " : "",
              "weight and bias must be on one device; x is on ", x.device());
  if (residual != nullptr) {
    TORCH_CHECK(residual->sizes() == x.sizes(), op, ": residual is ", residual->sizes(), ", x is ",
                x.sizes());
  }
}

at::Tensor LayerNormCpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        double eps) {
  CheckLayerNormArgs("qpool::layer_norm", x, nullptr, weight, bias, eps);
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps).contiguous();
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormCpu(const at::Tensor& x, const at::Tensor& residual,
                                                   const at::Tensor& weight, const at::Tensor& bias,
                                                   double eps) {
  CheckLayerNormArgs("qpool::add_layer_norm", x, &residual, weight, bias, eps);
  // Contiguous, as the Meta kernel (and a compiled package's fake) says, whatever the inputs'.
  at::Tensor sum = at::empty(x.sizes(), x.options());
  at::add_out(sum, x, residual);
  at::Tensor normed = at::layer_norm(sum, {x.size(-1)}, weight, bias, eps).contiguous();
  return {sum, normed};
}

namespace {

at::Tensor LayerNormMeta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         double eps) {
  CheckLayerNormArgs("qpool::layer_norm", x, nullptr, weight, bias, eps);
  return at::empty(x.sizes(), x.options());
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormMeta(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps) {
  CheckLayerNormArgs("qpool::add_layer_norm", x, &residual, weight, bias, eps);
  return {at::empty(x.sizes(), x.options()), at::empty(x.sizes(), x.options())};
}

}  // namespace

at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("qpool::layer_norm", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor> AddLayerNorm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::add_layer_norm", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, double)>();
  return op.call(x, residual, weight, bias, eps);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) {
  m.def(qpool::quant::kLayerNormSchema);
  m.def(qpool::quant::kAddLayerNormSchema);
}

TORCH_LIBRARY_IMPL(qpool, CPU, m) {
  m.impl("layer_norm", &qpool::quant::LayerNormCpu);
  m.impl("add_layer_norm", &qpool::quant::AddLayerNormCpu);
}

TORCH_LIBRARY_IMPL(qpool, Meta, m) {
  m.impl("layer_norm", &qpool::quant::LayerNormMeta);
  m.impl("add_layer_norm", &qpool::quant::AddLayerNormMeta);
}
