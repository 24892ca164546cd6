// qpool::group_norm on CUDA (Note [Group norm op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "quant/group_norm_kernels.h"
#include "quant/group_norm_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

at::Tensor GroupNormCuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         int64_t groups, double eps, const std::optional<at::Tensor>& add,
                         bool silu) {
  CheckGroupNormArgs(x, weight, bias, groups, eps, add);
  const at::ScalarType type = x.scalar_type();
  if (!HasElemType(type) || !x.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return GroupNormCpu(x, weight, bias, groups, eps, add, silu);
  }
  cuda::GroupNormArgs args;
  args.x = x.data_ptr();
  args.n = x.size(0);
  args.pixels = x.size(2) * x.size(3);
  args.c = x.size(1);
  args.groups = groups;
  args.eps = static_cast<float>(eps);
  args.silu = silu;
  args.type = ElemTypeOf(type);
  // Widths the kernels do not take, or no pixels: the ATen operations, on the GPU, before this
  // path allocates or copies anything.
  if (!cuda::GroupNormSupported(args)) return GroupNormCpu(x, weight, bias, groups, eps, add, silu);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  const at::Tensor w = weight.contiguous(), b = bias.contiguous();
  const at::Tensor a = add ? add->contiguous() : at::Tensor();
  args.add = a.defined() ? a.data_ptr() : nullptr;
  args.weight = w.data_ptr();
  args.bias = b.data_ptr();
  args.out = out.data_ptr();
  const at::Tensor workspace =
      at::empty({cuda::GroupNormWorkspaceFloats(args)}, x.options().dtype(at::kFloat));
  cuda::LaunchGroupNorm(args, workspace.data_ptr<float>(), at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("group_norm", &qpool::quant::GroupNormCuda); }
