#include "quant/bias_residual_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

namespace qpool::quant {

void CheckBiasResidualArgs(const at::Tensor& x, const at::Tensor& bias,
                           const at::Tensor& residual) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()),
              "qpool::bias_residual: x must be floating-point, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 2, "qpool::bias_residual: x is ", x.sizes(),
              ": it needs a channel dimension (dimension 1)");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(1), "qpool::bias_residual: bias is ",
              bias.sizes(), ", x has ", x.size(1), " channels");
  TORCH_CHECK(residual.sizes() == x.sizes(), "qpool::bias_residual: residual is ", residual.sizes(),
              ", x is ", x.sizes());
  TORCH_CHECK(bias.scalar_type() == x.scalar_type() && residual.scalar_type() == x.scalar_type(),
              "qpool::bias_residual: x, bias and residual must share a dtype, got ",
              x.scalar_type(), ", ", bias.scalar_type(), " and ", residual.scalar_type());
}

at::Tensor BiasResidualCpu(const at::Tensor& x, const at::Tensor& bias,
                           const at::Tensor& residual) {
  CheckBiasResidualArgs(x, bias, residual);
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = x.size(1);
  // Into x's layout, as the Meta kernel (and a compiled package's fake) says, whatever the
  // residual's.
  at::Tensor out = at::empty_like(x);
  at::add_out(out, residual, x + bias.view(shape));
  return out;
}

namespace {

at::Tensor BiasResidualMeta(const at::Tensor& x, const at::Tensor& bias,
                            const at::Tensor& residual) {
  CheckBiasResidualArgs(x, bias, residual);
  return at::empty_like(x);
}

}  // namespace

at::Tensor BiasResidual(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("qpool::bias_residual", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(x, bias, residual);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kBiasResidualSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("bias_residual", &qpool::quant::BiasResidualCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("bias_residual", &qpool::quant::BiasResidualMeta); }
