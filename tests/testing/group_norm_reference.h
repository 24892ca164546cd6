// The float64 result qpool::group_norm's tests (CPU and GPU) hold its kernels to (Note [Group norm
// op]): ATen's own group norm of x + add in double, then the SiLU.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace qpool::testing {

// silu(group_norm(x + add[:, :, None, None])) (the SiLU when `silu`) in float64.
inline at::Tensor GroupNormFloat64(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& bias, int64_t groups, double eps,
                                   const std::optional<at::Tensor>& add, bool silu) {
  at::Tensor sum = x.to(at::kDouble);
  if (add) sum = sum + add->to(at::kDouble).unsqueeze(-1).unsqueeze(-1);
  const at::Tensor y =
      at::group_norm(sum.contiguous(), groups, weight.to(at::kDouble), bias.to(at::kDouble), eps);
  return silu ? at::silu(y) : y;
}

}  // namespace qpool::testing
