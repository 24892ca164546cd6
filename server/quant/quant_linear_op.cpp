#include "quant/quant_linear_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <vector>

#include "quant/quantizer.h"
#include "quant/w8a8_linear.h"

namespace qpool::quant {

namespace {

constexpr const char* kOpName = "qpool::quant_linear";

void CheckDevice(const at::Tensor& x, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), kOpName, ": ", name, " is undefined (pass an empty tensor instead)");
  TORCH_CHECK(t.device() == x.device(), kOpName, ": ", name, " is on ", t.device(), " but x is on ",
              x.device(), "; every tensor of a quantized linear layer must be on x's device");
}

QuantState MakeState(const at::Tensor& weight, const at::Tensor& absmax, const at::Tensor& code,
                     const at::Tensor& nested_absmax, const at::Tensor& nested_code,
                     const at::Tensor& offset) {
  return QuantState{weight, absmax, code, nested_absmax, nested_code, offset};
}

at::Tensor QuantLinearMeta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& absmax,
                           const at::Tensor& code, const at::Tensor& nested_absmax,
                           const at::Tensor& nested_code, const at::Tensor& offset,
                           const std::optional<at::Tensor>& bias) {
  CheckSameDevice(x, MakeState(weight, absmax, code, nested_absmax, nested_code, offset), bias);
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2, kOpName, ": x must be [..., in], weight 2-D");
  return at::empty(QuantLinearOutputShape(x, weight.size(0)), x.options());
}

}  // namespace

void CheckSameDevice(const at::Tensor& x, const QuantState& s,
                     const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.defined(), kOpName, ": x is undefined");
  CheckDevice(x, s.weight, "weight");
  CheckDevice(x, s.absmax, "absmax");
  CheckDevice(x, s.code, "code");
  CheckDevice(x, s.nested_absmax, "nested_absmax");
  CheckDevice(x, s.nested_code, "nested_code");
  CheckDevice(x, s.offset, "offset");
  if (bias.has_value() && bias->defined()) CheckDevice(x, *bias, "bias");
}

QuantLayout CheckQuantLinearArgs(const at::Tensor& x, const QuantState& s,
                                 const std::optional<at::Tensor>& bias) {
  const at::ScalarType t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, kOpName,
              ": x must be float32, float16 or bfloat16, got ", t);
  TORCH_CHECK(x.dim() >= 1, kOpName, ": x must be [..., in_features], got a 0-d tensor");
  QuantLayout layout = InspectQuantState(s, x.size(-1), kOpName);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == layout.out_features, kOpName,
                ": bias must be [", layout.out_features, "], got ", bias->sizes());
    TORCH_CHECK(at::isFloatingType(bias->scalar_type()), kOpName, ": bias must be floating, got ",
                bias->scalar_type());
  }
  return layout;
}

std::vector<int64_t> QuantLinearOutputShape(const at::Tensor& x, int64_t out_features) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  return shape;
}

at::Tensor QuantLinearCpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& absmax,
                          const at::Tensor& code, const at::Tensor& nested_absmax,
                          const at::Tensor& nested_code, const at::Tensor& offset,
                          const std::optional<at::Tensor>& bias) {
  const QuantState s = MakeState(weight, absmax, code, nested_absmax, nested_code, offset);
  CheckSameDevice(x, s, bias);
  const QuantLayout layout = CheckQuantLinearArgs(x, s, bias);
  if (x.numel() == 0) return at::empty(QuantLinearOutputShape(x, layout.out_features), x.options());
  if (layout.format == QuantFormat::kW8A8) {  // Note [W8A8 linear]; falls back to this kernel
    return W8A8Linear(
        x, s, bias,
        [](const at::Tensor& xs, const QuantState& q, const std::optional<at::Tensor>& b) {
          return QuantLinearCpu(xs, q.weight, q.absmax, q.code, q.nested_absmax, q.nested_code,
                                q.offset, b);
        });
  }
  // Note [CPU quant_linear]: the CPU kernel is the reference: dequantize in float32 (exactly the
  // values quant.py's dequantize() computes), one float32 GEMM, then cast. Simple and correct;
  // the CPU only serves tests and small pipelines.
  at::Tensor w = Dequantize(s, x.size(-1), at::kFloat);
  std::optional<at::Tensor> b;
  if (bias.has_value() && bias->defined()) b = bias->to(at::kFloat);
  return at::linear(x.to(at::kFloat), w, b).to(x.scalar_type());
}

at::Tensor QuantLinear(const at::Tensor& x, const QuantState& s,
                       const std::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kOpName, "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, s.weight, s.absmax, s.code, s.nested_absmax, s.nested_code, s.offset, bias);
}

}  // namespace qpool::quant

TORCH_LIBRARY(qpool, m) { m.def(qpool::quant::kQuantLinearSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("quant_linear", &qpool::quant::QuantLinearCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) { m.impl("quant_linear", &qpool::quant::QuantLinearMeta); }
