#include "quant/rope_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace qpool::quant {

void CheckRopeArgs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4, "qpool::rope: x must be [B, N, H, D], got ", x.sizes());
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
              "qpool::rope: x must be float32, float16 or bfloat16, got ", type);
  TORCH_CHECK(x.size(3) % 2 == 0, "qpool::rope: x's last dimension (", x.size(3),
              ") must be even: it holds channel pairs");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"cos", cos},
                                std::pair<const char*, const at::Tensor&>{"sin", sin}}) {
    TORCH_CHECK(t.scalar_type() == at::kFloat, "qpool::rope: ", name, " must be float32, got ",
                t.scalar_type());
    TORCH_CHECK(t.dim() == 4 && t.size(0) == 1 && t.size(1) == x.size(1) && t.size(2) == 1 &&
                    t.size(3) == x.size(3),
                "qpool::rope: ", name, " must be [1, ", x.size(1), ", 1, ", x.size(3),
                "] for x of ", x.sizes(), ", got ", t.sizes());
    TORCH_CHECK(t.device() == x.device(), "qpool::rope: ", name, " is on ", t.device(),
                " but x is on ", x.device());
  }
}

at::Tensor RopeCpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  CheckRopeArgs(x, cos, sin);
  const at::Tensor pairs = x.unflatten(-1, {-1, 2}).to(at::kFloat);  // [B, N, H, D / 2, 2]
  const auto parts = pairs.unbind(-1);
  const at::Tensor rotated = at::stack({-parts[1], parts[0]}, -1).flatten(3);
  return (pairs.flatten(3) * cos + rotated * sin).to(x.scalar_type());
}

namespace {

at::Tensor RopeMeta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  CheckRopeArgs(x, cos, sin);
  return at::empty_like(x);
}

}  // namespace

at::Tensor Rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("qpool::rope", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(x, cos, sin);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kRopeSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("rope", &qpool::quant::RopeCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("rope", &qpool::quant::RopeMeta); }
