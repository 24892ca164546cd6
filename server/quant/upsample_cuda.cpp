// qpool::upsample_nearest on CUDA (Note [Upsample op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/quant_linear_cuda.h"
#include "quant/upsample_kernels.h"
#include "quant/upsample_op.h"

namespace qpool::quant {
namespace {

at::Tensor UpsampleNearestCuda(const at::Tensor& x, const std::optional<at::Tensor>& like) {
  CheckUpsampleArgs(x, like);
  const auto [height, width] = UpsampledSize(x, like);
  // The output takes the layout ATen's would (x's suggested one): channels-last here, also for
  // maps of one pixel, whose strides fit both layouts.
  if (height != 2 * x.size(2) || width != 2 * x.size(3) || !HasElemType(x.scalar_type()) ||
      x.suggest_memory_format() != at::MemoryFormat::ChannelsLast ||
      !x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return UpsampleNearestCpu(x, like);
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out =
      at::empty({x.size(0), x.size(1), height, width}, x.options(), at::MemoryFormat::ChannelsLast);
  cuda::UpsampleArgs args;
  args.x = x.data_ptr();
  args.out = out.data_ptr();
  args.n = x.size(0);
  args.c = x.size(1);
  args.h = x.size(2);
  args.w = x.size(3);
  args.type = ElemTypeOf(x.scalar_type());
  if (!cuda::UpsampleSupported(args)) return UpsampleNearestCpu(x, like);
  cuda::LaunchUpsample(args, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) {
  m.impl("upsample_nearest", &qpool::quant::UpsampleNearestCuda);
}
