#include "quant/w8a8_linear.h"

#include <c10/core/GradMode.h>

#include <vector>

#include "quant/quantizer.h"

namespace qpool::quant {

bool W8A8IntMatmulRuns(int64_t rows, int64_t in_features, int64_t out_features) {
  return rows >= kW8A8MinRows && in_features > 0 && in_features % kW8A8Multiple == 0 &&
         out_features > 0 && out_features % kW8A8Multiple == 0;
}

at::Tensor W8A8Linear(const at::Tensor& x, const QuantState& s,
                      const std::optional<at::Tensor>& bias, const WeightOnlyLinear& weight_only) {
  c10::AutoGradMode no_grad(false);
  const int64_t k = x.size(-1);
  const int64_t n = s.weight.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  const at::Tensor x2 = x.reshape({-1, k});
  const at::Tensor xs = x2.to(at::kFloat).div(s.code);
  if (!W8A8IntMatmulRuns(x2.size(0), k, n)) {
    const at::Tensor empty = EmptyState(x.device());
    const QuantState int8{s.weight, s.absmax, empty, empty, empty, empty};
    return weight_only(xs.to(x.scalar_type()), int8, bias).reshape(out_shape);
  }
  const at::Tensor amax = xs.abs().amax(1);
  const at::Tensor acc = at::_int_mm(RowsToInt8(xs, amax), s.weight.contiguous().t());
  at::Tensor y = acc.to(at::kFloat).mul(DivideBy127(amax).unsqueeze(1)).mul(DivideBy127(s.absmax));
  if (bias.has_value() && bias->defined()) y = y.add(bias->to(at::kFloat));
  return y.to(x.scalar_type()).reshape(out_shape);
}

}  // namespace qpool::quant
