#include "quant/swiglu_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

namespace qpool::quant {

void CheckSwigluArgs(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "qpool::swiglu: x must be floating-point, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, "qpool::swiglu: x must have at least one dimension");
  TORCH_CHECK(x.size(-1) % 2 == 0, "qpool::swiglu: x is ", x.sizes(),
              ": its last dimension must be even (gate, then value)");
  if (!weight.has_value()) return;
  TORCH_CHECK(weight->scalar_type() == x.scalar_type(), "qpool::swiglu: weight is ",
              weight->scalar_type(), ", x is ", x.scalar_type(), ": they must match");
  TORCH_CHECK(weight->device() == x.device(), "qpool::swiglu: weight is on ", weight->device(),
              ", x on ", x.device());
  TORCH_CHECK(weight->sizes() == x.sizes().slice(0, x.dim() - 1), "qpool::swiglu: weight is ",
              weight->sizes(), " for x ", x.sizes(),
              ": expected x's shape without its last "
              "dimension");
}

at::Tensor SwigluCpu(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  CheckSwigluArgs(x, weight);
  const std::vector<at::Tensor> parts = x.chunk(2, -1);
  const at::Tensor out = at::silu(parts[0]) * parts[1];
  return weight.has_value() ? out * weight->unsqueeze(-1) : out;
}

namespace {

at::Tensor SwigluMeta(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  CheckSwigluArgs(x, weight);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() /= 2;
  return at::empty(sizes, x.options());
}

}  // namespace

at::Tensor Swiglu(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::swiglu", "")
                       .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, weight);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kSwigluSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("swiglu", &qpool::quant::SwigluCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("swiglu", &qpool::quant::SwigluMeta); }
