#include "quant/geglu_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

namespace qpool::quant {

void CheckGegluArgs(const at::Tensor& x) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "qpool::geglu: x must be floating-point, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, "qpool::geglu: x must have at least one dimension");
  TORCH_CHECK(x.size(-1) % 2 == 0, "qpool::geglu: x is ", x.sizes(),
              ": its last dimension must be even (value, then gate)");
}

at::Tensor GegluCpu(const at::Tensor& x) {
  CheckGegluArgs(x);
  const std::vector<at::Tensor> parts = x.chunk(2, -1);
  return parts[0] * at::gelu(parts[1]);
}

namespace {

at::Tensor GegluMeta(const at::Tensor& x) {
  CheckGegluArgs(x);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() /= 2;
  return at::empty(sizes, x.options());
}

}  // namespace

at::Tensor Geglu(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::geglu", "")
                       .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kGegluSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("geglu", &qpool::quant::GegluCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("geglu", &qpool::quant::GegluMeta); }
