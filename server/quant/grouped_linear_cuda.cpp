// qpool::grouped_quant_linear on CUDA (Note [Grouped linear op]): the layer dequantized into x's
// dtype by quant_linear's dequantize kernel, then one grouped product.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/grouped_linear_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

at::Tensor GroupedQuantLinearCuda(const at::Tensor& x, const at::Tensor& offs,
                                  const at::Tensor& weight, const at::Tensor& absmax,
                                  const at::Tensor& code, const at::Tensor& nested_absmax,
                                  const at::Tensor& nested_code, const at::Tensor& offset) {
  const QuantState s{weight, absmax, code, nested_absmax, nested_code, offset};
  const GroupedLayout layout = CheckGroupedQuantLinearArgs(x, offs, s);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor w = layout.layer.format == QuantFormat::kNone
                           ? weight.to(x.scalar_type())
                           : DequantizeCuda(s, x.size(1), x.scalar_type());
  return GroupedProduct(x, offs, w, layout);
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) {
  m.impl("grouped_quant_linear", &qpool::quant::GroupedQuantLinearCuda);
}
