// qpool::layer_norm and qpool::add_layer_norm on CUDA (Note [Residual layer norm]): the
// warp-per-row kernel against ATen's addition (bit for bit) and aten::layer_norm (within a unit in
// the last place of the dtype) at SDXL's widths and odd ones, the fallbacks, and inside a CUDA
// graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "quant/layer_norm_op.h"
#include "testing/cuda_graph_replay.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

void ExpectNormClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(got.is_contiguous()) << what;
  testing::ExpectCloseToTheUnfusedOps(got, want, what);
  const at::Tensor g = got.to(at::kFloat);
  const at::Tensor w = want.to(at::kFloat);
  // In 16-bit dtypes only a few values may round apart (another summation order of the
  // statistics moves the float32 result by less than a unit of the dtype); float32's own last
  // bits differ in many.
  if (got.scalar_type() == at::kHalf || got.scalar_type() == at::kBFloat16) {
    EXPECT_LT(g.ne(w).to(at::kFloat).mean().item<float>(), 0.05) << what;
  }
}

TEST(LayerNormCuda, EqualsAtenAdditionAndNorm) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(53);
  // SDXL's two widths at four images with CFG, SD 1.5's narrowest, the widest the kernel
  // holds in fp16, a row of five packs, and widths the kernel declines (not a multiple of 16
  // bytes; too wide), which run the ATen operations.
  const std::vector<std::vector<int64_t>> shapes = {{8, 4096, 640}, {8, 1024, 1280}, {2, 77, 320},
                                                    {3, 5, 2048},   {3, 7, 40},      {2, 9, 36},
                                                    {2, 3, 4104}};
  for (const auto& shape : shapes) {
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      const auto options = at::TensorOptions().device(at::kCUDA).dtype(type);
      const int64_t d = shape.back();
      const at::Tensor x = at::randn(shape, options) * 3 + 1;
      const at::Tensor residual = at::randn(shape, options) * 2;
      const at::Tensor weight = at::randn({d}, options);
      const at::Tensor bias = at::randn({d}, options);
      const std::string what = std::string(c10::toString(type)) + " d=" + std::to_string(d);
      const auto [sum, normed] = AddLayerNorm(x, residual, weight, bias, 1e-5);
      const at::Tensor want_sum = x + residual;
      EXPECT_TRUE(at::equal(sum, want_sum)) << what;
      ExpectNormClose(normed, at::layer_norm(want_sum, {d}, weight, bias, 1e-5), what);
      ExpectNormClose(LayerNorm(x, weight, bias, 1e-6), at::layer_norm(x, {d}, weight, bias, 1e-6),
                      what + " without residual");
    }
  }
}

TEST(LayerNormCuda, TakesStridedInputs) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(54);
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x = at::randn({2, 640, 64}, options).transpose(1, 2);
  const at::Tensor residual = at::randn({2, 64, 640}, options);
  const at::Tensor weight = at::randn({640}, options);
  const at::Tensor bias = at::randn({640}, options);
  const auto [sum, normed] = AddLayerNorm(x, residual, weight, bias, 1e-5);
  EXPECT_TRUE(sum.is_contiguous());
  EXPECT_TRUE(at::equal(sum, x + residual));
  ExpectNormClose(normed, at::layer_norm(x + residual, {640}, weight, bias, 1e-5), "transposed");
}

TEST(LayerNormCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(55);
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x = at::randn({2, 256, 1280}, options);
  const at::Tensor residual = at::randn_like(x);
  const at::Tensor weight = at::randn({1280}, options);
  const at::Tensor bias = at::randn({1280}, options);
  const at::Tensor replayed = testing::ReplayedAfterChange(
      [&] { return std::get<1>(AddLayerNorm(x, residual, weight, bias, 1e-5)); },
      [&] {
        x.copy_(at::randn_like(x));
        weight.copy_(at::randn_like(weight));
      });
  ExpectNormClose(replayed, at::layer_norm(x + residual, {1280}, weight, bias, 1e-5), "replayed");
}

}  // namespace
}  // namespace qpool::quant
