#include "quant/rope_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

namespace qpool::quant {

namespace {

// The checks both ops share, for x (or the joined xs) of `type` [B, n, H, d] on `device`.
void CheckValuesAndTables(const char* op, const char* x_name, at::ScalarType type, int64_t n,
                          int64_t d, const c10::Device& device, const at::Tensor& cos,
                          const at::Tensor& sin) {
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, op, ": ", x_name,
              " must be float32, float16 or bfloat16, got ", type);
  TORCH_CHECK(d % 2 == 0, op, ": ", x_name, "'s last dimension (", d,
              ") must be even: it holds channel pairs");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"cos", cos},
                                std::pair<const char*, const at::Tensor&>{"sin", sin}}) {
    TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
                t.scalar_type());
    TORCH_CHECK(
        t.dim() == 4 && t.size(0) == 1 && t.size(1) == n && t.size(2) == 1 && t.size(3) == d, op,
        ": ", name, " must be [1, ", n, ", 1, ", d, "] for ", n, " tokens of ", d, " values, got ",
        t.sizes());
    TORCH_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but ", x_name,
                " is on ", device);
  }
}

}  // namespace

void CheckRopeArgs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4, "qpool::rope: x must be [B, N, H, D], got ", x.sizes());
  CheckValuesAndTables("qpool::rope", "x", x.scalar_type(), x.size(1), x.size(3), x.device(), cos,
                       sin);
}

at::Tensor RopeCpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  CheckRopeArgs(x, cos, sin);
  const at::Tensor pairs = x.unflatten(-1, {-1, 2}).to(at::kFloat);  // [B, N, H, D / 2, 2]
  const auto parts = pairs.unbind(-1);
  const at::Tensor rotated = at::stack({-parts[1], parts[0]}, -1).flatten(3);
  return (pairs.flatten(3) * cos + rotated * sin).to(x.scalar_type());
}

void CheckRmsRopeArgs(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                      const at::Tensor& sin) {
  TORCH_CHECK(!xs.empty(), "qpool::rms_rope: xs is empty");
  TORCH_CHECK(weights.size() == xs.size(), "qpool::rms_rope: ", xs.size(), " parts but ",
              weights.size(), " weights");
  TORCH_CHECK(eps >= 0, "qpool::rms_rope: eps must be >= 0, got ", eps);
  const at::Tensor& first = xs[0];
  int64_t tokens = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const at::Tensor& x = xs[i];
    TORCH_CHECK(x.dim() == 4, "qpool::rms_rope: xs[", i, "] must be [B, N, H, D], got ", x.sizes());
    TORCH_CHECK(x.scalar_type() == first.scalar_type(), "qpool::rms_rope: xs[", i, "] is ",
                x.scalar_type(), ", xs[0] ", first.scalar_type());
    TORCH_CHECK(
        x.size(0) == first.size(0) && x.size(2) == first.size(2) && x.size(3) == first.size(3),
        "qpool::rms_rope: xs[", i, "] is ", x.sizes(), ", xs[0] ", first.sizes(),
        ": only the token counts may differ");
    TORCH_CHECK(x.device() == first.device(), "qpool::rms_rope: xs[", i, "] is on ", x.device(),
                ", xs[0] on ", first.device());
    const at::Tensor& w = weights[i];
    TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(3) && w.is_floating_point(),
                "qpool::rms_rope: weights[", i, "] must be a float [", x.size(3), "], got ",
                w.scalar_type(), " ", w.sizes());
    TORCH_CHECK(w.device() == x.device(), "qpool::rms_rope: weights[", i, "] is on ", w.device(),
                " but xs[", i, "] is on ", x.device());
    tokens += x.size(1);
  }
  CheckValuesAndTables("qpool::rms_rope", "xs", first.scalar_type(), tokens, first.size(3),
                       first.device(), cos, sin);
}

at::Tensor RmsRopeCpu(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                      const at::Tensor& sin) {
  CheckRmsRopeArgs(xs, weights, eps, cos, sin);
  std::vector<at::Tensor> normed;
  normed.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    normed.push_back(at::rms_norm(xs[i], {xs[i].size(3)}, weights[i], eps));
  }
  return RopeCpu(normed.size() == 1 ? normed[0] : at::cat(normed, 1), cos, sin);
}

namespace {

at::Tensor RmsRopeMeta(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                       const at::Tensor& sin) {
  CheckRmsRopeArgs(xs, weights, eps, cos, sin);
  return at::empty({xs[0].size(0), cos.size(1), xs[0].size(2), xs[0].size(3)}, xs[0].options());
}

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

at::Tensor RmsRope(at::TensorList xs, at::TensorList weights, double eps, const at::Tensor& cos,
                   const at::Tensor& sin) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::rms_rope", "")
                       .typed<at::Tensor(at::TensorList, at::TensorList, double, const at::Tensor&,
                                         const at::Tensor&)>();
  return op.call(xs, weights, eps, cos, sin);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) {
  m.def(qpool::quant::kRopeSchema);
  m.def(qpool::quant::kRmsRopeSchema);
}

TORCH_LIBRARY_IMPL(qpool, CPU, m) {
  m.impl("rope", &qpool::quant::RopeCpu);
  m.impl("rms_rope", &qpool::quant::RmsRopeCpu);
}

TORCH_LIBRARY_IMPL(qpool, Meta, m) {
  m.impl("rope", &qpool::quant::RopeMeta);
  m.impl("rms_rope", &qpool::quant::RmsRopeMeta);
}
