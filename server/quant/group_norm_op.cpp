#include "quant/group_norm_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>

namespace qpool::quant {

void CheckGroupNormArgs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        int64_t groups, double eps, const std::optional<at::Tensor>& add) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()),
              "qpool::group_norm: x must be floating-point, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 4, "qpool::group_norm: x must be [N, C, H, W], got ", x.sizes());
  const int64_t c = x.size(1);
  TORCH_CHECK(groups > 0 && c % groups == 0, "qpool::group_norm: groups (", groups,
              ") must be positive and divide the ", c, " channels of x");
  TORCH_CHECK(eps >= 0 && std::isfinite(eps), "qpool::group_norm: eps must be >= 0, got ", eps);
  const auto check = [&](const at::Tensor& t, const char* name, at::IntArrayRef sizes) {
    TORCH_CHECK(t.sizes() == sizes, "qpool::group_norm: ", name, " must be ", sizes, ", got ",
                t.sizes());
    TORCH_CHECK(t.scalar_type() == x.scalar_type(), "qpool::group_norm: ", name, " is ",
                t.scalar_type(), " where x is ", x.scalar_type());
    TORCH_CHECK(t.device() == x.device(), "qpool::group_norm: ", name, " is on ", t.device(),
                " where x is on ", x.device());
  };
  check(weight, "weight", {c});
  check(bias, "bias", {c});
  if (add) check(*add, "add", {x.size(0), c});
}

at::Tensor GroupNormCpu(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& bias,
                        int64_t groups, double eps, const std::optional<at::Tensor>& add,
                        bool silu) {
  CheckGroupNormArgs(x_in, weight, bias, groups, eps, add);
  const at::Tensor x = add ? x_in + add->unsqueeze(-1).unsqueeze(-1) : x_in;
  // The exporter's ChannelsLastGroupNorm, operation for operation.
  const auto [sd, mean] = at::std_mean(x.unflatten(1, {groups, -1}), {2, 3, 4}, /*correction=*/0);
  const at::Tensor rstd = at::reciprocal(at::hypot(sd, at::full_like(sd, std::sqrt(eps))));
  const at::Tensor scale = rstd.unsqueeze(-1) * weight.reshape({groups, -1});
  const at::Tensor shift =
      at::addcmul(bias.reshape({groups, -1}), mean.unsqueeze(-1), scale, /*value=*/-1);
  at::Tensor y = at::addcmul(shift.flatten(1).unsqueeze(-1).unsqueeze(-1), x,
                             scale.flatten(1).unsqueeze(-1).unsqueeze(-1));
  return silu ? at::silu(y) : y;
}

namespace {

at::Tensor GroupNormMeta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         int64_t groups, double eps, const std::optional<at::Tensor>& add,
                         bool /*silu*/) {
  CheckGroupNormArgs(x, weight, bias, groups, eps, add);
  return at::empty_like(x);
}

}  // namespace

at::Tensor GroupNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     int64_t groups, double eps, const std::optional<at::Tensor>& add, bool silu) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("qpool::group_norm", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                            double, const std::optional<at::Tensor>&, bool)>();
  return op.call(x, weight, bias, groups, eps, add, silu);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kGroupNormSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("group_norm", &qpool::quant::GroupNormCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("group_norm", &qpool::quant::GroupNormMeta); }
