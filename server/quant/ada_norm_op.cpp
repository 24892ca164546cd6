#include "quant/ada_norm_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace qpool::quant {

void CheckAdaNormArgs(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                      double eps) {
  TORCH_CHECK(x.dim() == 3, "qpool::ada_norm: x must be [B, N, D], got ", x.sizes());
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
              "qpool::ada_norm: x must be float32, float16 or bfloat16, got ", type);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"shift", shift},
                                std::pair<const char*, const at::Tensor&>{"scale", scale}}) {
    TORCH_CHECK(t.dim() == 2 && t.size(0) == x.size(0) && t.size(1) == x.size(2),
                "qpool::ada_norm: ", name, " must be [", x.size(0), ", ", x.size(2), "] for x of ",
                x.sizes(), ", got ", t.sizes());
    TORCH_CHECK(t.scalar_type() == type, "qpool::ada_norm: ", name, " is ", t.scalar_type(), ", x ",
                type);
    TORCH_CHECK(t.device() == x.device(), "qpool::ada_norm: ", name, " is on ", t.device(),
                " but x is on ", x.device());
  }
  TORCH_CHECK(eps >= 0, "qpool::ada_norm: eps must be >= 0, got ", eps);
}

at::Tensor AdaNormCpu(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                      double eps) {
  CheckAdaNormArgs(x, shift, scale, eps);
  const at::Tensor normed = at::layer_norm(x, {x.size(2)}, {}, {}, eps);
  return at::addcmul(shift.unsqueeze(1), normed, scale.unsqueeze(1) + 1);
}

namespace {

at::Tensor AdaNormMeta(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                       double eps) {
  CheckAdaNormArgs(x, shift, scale, eps);
  return at::empty(x.sizes(), x.options());
}

}  // namespace

at::Tensor AdaNorm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                   double eps) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("qpool::ada_norm", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, shift, scale, eps);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kAdaNormSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("ada_norm", &qpool::quant::AdaNormCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("ada_norm", &qpool::quant::AdaNormMeta); }
