#include "quant/upsample_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <utility>

namespace qpool::quant {

void CheckUpsampleArgs(const at::Tensor& x, const std::optional<at::Tensor>& like) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()),
              "qpool::upsample_nearest: x must be floating-point, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 4, "qpool::upsample_nearest: x is ", x.sizes(), ", not [N, C, H, W]");
  if (like) {
    TORCH_CHECK(like->dim() == 4 && like->size(2) > 0 && like->size(3) > 0,
                "qpool::upsample_nearest: like is ", like->sizes(),
                ", not [N, C, H, W] with a height and width");
  }
}

std::pair<int64_t, int64_t> UpsampledSize(const at::Tensor& x,
                                          const std::optional<at::Tensor>& like) {
  if (like) return {like->size(2), like->size(3)};
  return {2 * x.size(2), 2 * x.size(3)};
}

at::Tensor UpsampleNearestCpu(const at::Tensor& x, const std::optional<at::Tensor>& like) {
  CheckUpsampleArgs(x, like);
  const auto [height, width] = UpsampledSize(x, like);
  // ATen's upsampling keeps a channels-last input channels-last.
  return at::upsample_nearest2d(x, {height, width});
}

namespace {

at::Tensor UpsampleNearestMeta(const at::Tensor& x, const std::optional<at::Tensor>& like) {
  CheckUpsampleArgs(x, like);
  const auto [height, width] = UpsampledSize(x, like);
  return at::empty({x.size(0), x.size(1), height, width}, x.options(), x.suggest_memory_format());
}

}  // namespace

at::Tensor UpsampleNearest(const at::Tensor& x, const std::optional<at::Tensor>& like) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("qpool::upsample_nearest", "")
                       .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, like);
}

}  // namespace qpool::quant

TORCH_LIBRARY_FRAGMENT(qpool, m) { m.def(qpool::quant::kUpsampleSchema); }

TORCH_LIBRARY_IMPL(qpool, CPU, m) { m.impl("upsample_nearest", &qpool::quant::UpsampleNearestCpu); }

TORCH_LIBRARY_IMPL(qpool, Meta, m) {
  m.impl("upsample_nearest", &qpool::quant::UpsampleNearestMeta);
}
