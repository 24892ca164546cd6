#include "quant/grouped_linear_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"

namespace qpool::quant {

namespace {

constexpr const char* kOpName = "qpool::grouped_quant_linear";

QuantState MakeState(const at::Tensor& weight, const at::Tensor& absmax, const at::Tensor& code,
                     const at::Tensor& nested_absmax, const at::Tensor& nested_code,
                     const at::Tensor& offset) {
  return QuantState{weight, absmax, code, nested_absmax, nested_code, offset};
}

void CheckShapes(const at::Tensor& x, const at::Tensor& offs, const QuantState& s) {
  TORCH_CHECK(x.defined() && offs.defined(), kOpName, ": x and offs must be defined");
  CheckSameDevice(x, s, std::nullopt);
  TORCH_CHECK(offs.device() == x.device(), kOpName, ": offs is on ", offs.device(), " but x is on ",
              x.device(), "; every tensor must be on x's device");
  TORCH_CHECK(x.dim() == 2, kOpName, ": x must be [rows, in_features], got ", x.sizes());
  TORCH_CHECK(offs.dim() == 1 && offs.size(0) >= 1 && offs.scalar_type() == at::kInt, kOpName,
              ": offs must be int32 [groups] with at least one group, got ", offs.scalar_type(),
              " ", offs.sizes());
  TORCH_CHECK(s.weight.dim() == 2 && s.weight.size(0) % offs.size(0) == 0, kOpName,
              ": weight must be [groups * out_features, ...] for ", offs.size(0), " groups, got ",
              s.weight.sizes());
}

at::Tensor GroupedQuantLinearCpu(const at::Tensor& x, const at::Tensor& offs,
                                 const at::Tensor& weight, const at::Tensor& absmax,
                                 const at::Tensor& code, const at::Tensor& nested_absmax,
                                 const at::Tensor& nested_code, const at::Tensor& offset) {
  const QuantState s = MakeState(weight, absmax, code, nested_absmax, nested_code, offset);
  const GroupedLayout layout = CheckGroupedQuantLinearArgs(x, offs, s);
  // A float layer multiplies in x's dtype, as at::_grouped_mm of the unquantized experts would;
  // a quantized one in float32 (Note [CPU quant_linear]).
  if (layout.layer.format == QuantFormat::kNone) {
    return GroupedProduct(x, offs, weight.to(x.scalar_type()), layout);
  }
  return GroupedProduct(x.to(at::kFloat), offs, Dequantize(s, x.size(1), at::kFloat), layout)
      .to(x.scalar_type());
}

at::Tensor GroupedQuantLinearMeta(const at::Tensor& x, const at::Tensor& offs,
                                  const at::Tensor& weight, const at::Tensor& absmax,
                                  const at::Tensor& code, const at::Tensor& nested_absmax,
                                  const at::Tensor& nested_code, const at::Tensor& offset) {
  // As qpool::quant_linear's Meta kernel: shapes and devices, no look at the state's values.
  CheckShapes(x, offs, MakeState(weight, absmax, code, nested_absmax, nested_code, offset));
  return at::empty({x.size(0), weight.size(0) / offs.size(0)}, x.options());
}

}  // namespace

GroupedLayout CheckGroupedQuantLinearArgs(const at::Tensor& x, const at::Tensor& offs,
                                          const QuantState& s) {
  CheckShapes(x, offs, s);
  GroupedLayout layout;
  layout.layer = CheckQuantLinearArgs(x, s, std::nullopt);
  layout.groups = offs.size(0);
  layout.out_features = layout.layer.out_features / layout.groups;
  return layout;
}

at::Tensor GroupedProduct(const at::Tensor& x, const at::Tensor& offs, const at::Tensor& weight,
                          const GroupedLayout& layout) {
  if (x.size(0) == 0) return at::empty({0, layout.out_features}, x.options());
  // contiguous(): _grouped_mm takes each group's [K, N] operand as the transpose of a row-major
  // [N, K] matrix.
  const at::Tensor w =
      weight.contiguous().view({layout.groups, layout.out_features, x.size(1)}).transpose(1, 2);
  return at::_grouped_mm(x.contiguous(), w, offs);
}

at::Tensor GroupedQuantLinear(const at::Tensor& x, const at::Tensor& offs, const QuantState& s) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(kOpName, "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&)>();
  return op.call(x, offs, s.weight, s.absmax, s.code, s.nested_absmax, s.nested_code, s.offset);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kGroupedQuantLinearSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) {
  m.impl("grouped_quant_linear", &qpool::quant::GroupedQuantLinearCpu);
}

TORCH_LIBRARY_IMPL(qpool, Meta, m) {
  m.impl("grouped_quant_linear", &qpool::quant::GroupedQuantLinearMeta);
}
