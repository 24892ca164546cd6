// qpool::bias_residual on CUDA (Note [Convolution biases]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/bias_residual_kernels.h"
#include "quant/bias_residual_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

at::Tensor BiasResidualCuda(const at::Tensor& x, const at::Tensor& bias,
                            const at::Tensor& residual) {
  CheckBiasResidualArgs(x, bias, residual);
  const at::ScalarType type = x.scalar_type();
  // Both maps dense in one layout: channels-last, else NCHW; anything else runs the additions.
  std::optional<at::MemoryFormat> format;
  for (at::MemoryFormat f : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
    if (x.dim() == 4 && x.is_contiguous(f) && residual.is_contiguous(f)) {
      format = f;
      break;
    }
  }
  if (!HasElemType(type) || !format) return BiasResidualCpu(x, bias, residual);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x, *format);
  const at::Tensor b = bias.contiguous();
  cuda::BiasResidualArgs args;
  args.x = x.data_ptr();
  args.bias = b.data_ptr();
  args.residual = residual.data_ptr();
  args.out = out.data_ptr();
  args.n = x.size(0);
  args.c = x.size(1);
  args.pixels = x.size(2) * x.size(3);
  args.channels_last = *format == at::MemoryFormat::ChannelsLast;
  args.type = ElemTypeOf(type);
  cuda::LaunchBiasResidual(args, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("bias_residual", &qpool::quant::BiasResidualCuda); }
