#include "quant/geglu_linear_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "quant/geglu_op.h"
#include "quant/quant_linear_op.h"

namespace qpool::quant {

QuantLayout CheckGegluQuantLinearArgs(const at::Tensor& x, const QuantState& s,
                                      const std::optional<at::Tensor>& bias) {
  CheckGegluArgs(x);
  CheckSameDevice(x, s, bias);
  // The linear reads the GEGLU's output, x's value half in shape and dtype.
  return CheckQuantLinearArgs(x.narrow(-1, 0, x.size(-1) / 2), s, bias);
}

namespace {

// The two ops in turn through the dispatcher.
at::Tensor GegluQuantLinearCpu(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& absmax, const at::Tensor& code,
                               const at::Tensor& nested_absmax, const at::Tensor& nested_code,
                               const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  const QuantState s{weight, absmax, code, nested_absmax, nested_code, offset};
  CheckGegluQuantLinearArgs(x, s, bias);
  return QuantLinear(Geglu(x), s, bias);
}

at::Tensor GegluQuantLinearMeta(const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& absmax, const at::Tensor& code,
                                const at::Tensor& nested_absmax, const at::Tensor& nested_code,
                                const at::Tensor& offset, const std::optional<at::Tensor>& bias) {
  // As qpool::quant_linear's Meta kernel: shapes and devices, no look at the state's values.
  CheckGegluArgs(x);
  CheckSameDevice(x, QuantState{weight, absmax, code, nested_absmax, nested_code, offset}, bias);
  TORCH_CHECK(weight.dim() == 2, "qpool::geglu_quant_linear: weight must be 2-D");
  return at::empty(QuantLinearOutputShape(x, weight.size(0)), x.options());
}

}  // namespace

at::Tensor GegluQuantLinear(const at::Tensor& x, const QuantState& s,
                            const std::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::geglu_quant_linear", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, s.weight, s.absmax, s.code, s.nested_absmax, s.nested_code, s.offset, bias);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kGegluQuantLinearSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) {
  m.impl("geglu_quant_linear", &qpool::quant::GegluQuantLinearCpu);
}

TORCH_LIBRARY_IMPL(qpool, Meta, m) {
  m.impl("geglu_quant_linear", &qpool::quant::GegluQuantLinearMeta);
}
