#include "quant/cat_gelu_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

namespace qpool::quant {

void CheckCatGeluArgs(const at::Tensor& a, const at::Tensor& b) {
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"a", a},
                                std::pair<const char*, const at::Tensor&>{"b", b}}) {
    const auto type = t.scalar_type();
    TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
                "qpool::cat_gelu: ", name, " must be float32, float16 or bfloat16, got ", type);
    TORCH_CHECK(t.dim() >= 1, "qpool::cat_gelu: ", name, " must have at least one dimension");
  }
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "qpool::cat_gelu: a is ", a.scalar_type(), ", b ",
              b.scalar_type());
  TORCH_CHECK(
      a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 1) == b.sizes().slice(0, b.dim() - 1),
      "qpool::cat_gelu: a is ", a.sizes(), ", b ", b.sizes(),
      ": only the last dimension may differ");
  TORCH_CHECK(a.device() == b.device(), "qpool::cat_gelu: a is on ", a.device(), ", b on ",
              b.device());
}

at::Tensor CatGeluCpu(const at::Tensor& a, const at::Tensor& b) {
  CheckCatGeluArgs(a, b);
  return at::cat({a, at::gelu(b, "tanh")}, -1);
}

namespace {

at::Tensor CatGeluMeta(const at::Tensor& a, const at::Tensor& b) {
  CheckCatGeluArgs(a, b);
  std::vector<int64_t> sizes = a.sizes().vec();
  sizes.back() += b.size(-1);
  return at::empty(sizes, a.options());
}

}  // namespace

at::Tensor CatGelu(const at::Tensor& a, const at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::cat_gelu", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kCatGeluSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("cat_gelu", &qpool::quant::CatGeluCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("cat_gelu", &qpool::quant::CatGeluMeta); }
