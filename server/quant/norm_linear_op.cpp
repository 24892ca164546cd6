#include "quant/norm_linear_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "quant/layer_norm_op.h"
#include "quant/quant_linear_op.h"

namespace qpool::quant {

QuantLayout CheckNormQuantLinearArgs(const char* op, const at::Tensor& x,
                                     const at::Tensor* residual, const at::Tensor& norm_weight,
                                     const at::Tensor& norm_bias, double eps, const QuantState& s,
                                     const std::optional<at::Tensor>& bias) {
  CheckLayerNormArgs(op, x, residual, norm_weight, norm_bias, eps);
  CheckSameDevice(x, s, bias);
  return CheckQuantLinearArgs(x, s, bias);  // the normed rows have x's shape and dtype
}

std::tuple<at::Tensor, at::Tensor> NormThenQuantLinear(const at::Tensor& x,
                                                       const at::Tensor* residual,
                                                       const at::Tensor& norm_weight,
                                                       const at::Tensor& norm_bias, double eps,
                                                       const QuantState& s,
                                                       const std::optional<at::Tensor>& bias) {
  if (residual == nullptr) {
    return {at::Tensor(), QuantLinear(LayerNorm(x, norm_weight, norm_bias, eps), s, bias)};
  }
  auto [sum, normed] = AddLayerNorm(x, *residual, norm_weight, norm_bias, eps);
  return {sum, QuantLinear(normed, s, bias)};
}

namespace {

constexpr char kOp[] = "qpool::layer_norm_quant_linear";
constexpr char kAddOp[] = "qpool::add_layer_norm_quant_linear";

at::Tensor LayerNormQuantLinearCpu(const at::Tensor& x, const at::Tensor& norm_weight,
                                   const at::Tensor& norm_bias, double eps,
                                   const at::Tensor& weight, const at::Tensor& absmax,
                                   const at::Tensor& code, const at::Tensor& nested_absmax,
                                   const at::Tensor& nested_code, const at::Tensor& offset,
                                   const std::optional<at::Tensor>& bias) {
  const QuantState s{weight, absmax, code, nested_absmax, nested_code, offset};
  CheckNormQuantLinearArgs(kOp, x, nullptr, norm_weight, norm_bias, eps, s, bias);
  return std::get<1>(NormThenQuantLinear(x, nullptr, norm_weight, norm_bias, eps, s, bias));
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormQuantLinearCpu(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& norm_weight,
    const at::Tensor& norm_bias, double eps, const at::Tensor& weight, const at::Tensor& absmax,
    const at::Tensor& code, const at::Tensor& nested_absmax, const at::Tensor& nested_code,
    const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  const QuantState s{weight, absmax, code, nested_absmax, nested_code, offset};
  CheckNormQuantLinearArgs(kAddOp, x, &residual, norm_weight, norm_bias, eps, s, bias);
  return NormThenQuantLinear(x, &residual, norm_weight, norm_bias, eps, s, bias);
}

// As qpool::quant_linear's Meta kernel: shapes and devices, no look at the state's values.
at::Tensor MetaOutput(const char* op, const at::Tensor& x, const at::Tensor* residual,
                      const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps,
                      const QuantState& s, const std::optional<at::Tensor>& bias) {
  CheckLayerNormArgs(op, x, residual, norm_weight, norm_bias, eps);
  CheckSameDevice(x, s, bias);
  TORCH_CHECK(s.weight.dim() == 2, op, ": weight must be 2-D");
  return at::empty(QuantLinearOutputShape(x, s.weight.size(0)), x.options());
}

at::Tensor LayerNormQuantLinearMeta(const at::Tensor& x, const at::Tensor& norm_weight,
                                    const at::Tensor& norm_bias, double eps,
                                    const at::Tensor& weight, const at::Tensor& absmax,
                                    const at::Tensor& code, const at::Tensor& nested_absmax,
                                    const at::Tensor& nested_code, const at::Tensor& offset,
                                    const std::optional<at::Tensor>& bias) {
  return MetaOutput(kOp, x, nullptr, norm_weight, norm_bias, eps,
                    QuantState{weight, absmax, code, nested_absmax, nested_code, offset}, bias);
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormQuantLinearMeta(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& norm_weight,
    const at::Tensor& norm_bias, double eps, const at::Tensor& weight, const at::Tensor& absmax,
    const at::Tensor& code, const at::Tensor& nested_absmax, const at::Tensor& nested_code,
    const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  const QuantState s{weight, absmax, code, nested_absmax, nested_code, offset};
  at::Tensor out = MetaOutput(kAddOp, x, &residual, norm_weight, norm_bias, eps, s, bias);
  return {at::empty(x.sizes(), x.options()), out};
}

}  // namespace

at::Tensor LayerNormQuantLinear(const at::Tensor& x, const at::Tensor& norm_weight,
                                const at::Tensor& norm_bias, double eps, const QuantState& s,
                                const std::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kOp, "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         double, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, norm_weight, norm_bias, eps, s.weight, s.absmax, s.code, s.nested_absmax,
                 s.nested_code, s.offset, bias);
}

std::tuple<at::Tensor, at::Tensor> AddLayerNormQuantLinear(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           const at::Tensor& norm_weight,
                                                           const at::Tensor& norm_bias, double eps,
                                                           const QuantState& s,
                                                           const std::optional<at::Tensor>& bias) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow(kAddOp, "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, residual, norm_weight, norm_bias, eps, s.weight, s.absmax, s.code,
                 s.nested_absmax, s.nested_code, s.offset, bias);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) {
  m.def(qpool::quant::kLayerNormQuantLinearSchema);
  m.def(qpool::quant::kAddLayerNormQuantLinearSchema);
}

TORCH_LIBRARY_IMPL(qpool, CPU, m) {
  m.impl("layer_norm_quant_linear", &qpool::quant::LayerNormQuantLinearCpu);
  m.impl("add_layer_norm_quant_linear", &qpool::quant::AddLayerNormQuantLinearCpu);
}

TORCH_LIBRARY_IMPL(qpool, Meta, m) {
  m.impl("layer_norm_quant_linear", &qpool::quant::LayerNormQuantLinearMeta);
  m.impl("add_layer_norm_quant_linear", &qpool::quant::AddLayerNormQuantLinearMeta);
}
