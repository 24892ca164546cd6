// qpool::layer_norm and qpool::add_layer_norm on the CPU (Note [Residual layer norm]): the schemas
// the exporter traces, ATen's addition and norm, contiguous outputs, and errors that name the
// problem.
#include "quant/layer_norm_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(LayerNormOp, SchemasMatchTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::layer_norm"),
            std::string("qpool::") + kLayerNormSchema);
  EXPECT_EQ(testing::ExporterSchema("LAYER_NORM_SCHEMA", "blocks.py"), kLayerNormSchema);
  EXPECT_EQ(testing::RegisteredSchema("qpool::add_layer_norm"),
            std::string("qpool::") + kAddLayerNormSchema);
  EXPECT_EQ(testing::ExporterSchema("ADD_LAYER_NORM_SCHEMA", "blocks.py"), kAddLayerNormSchema);
}

TEST(LayerNormOp, AddsThenNormsAsAten) {
  torch::manual_seed(37);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    const at::Tensor x = (at::randn({2, 5, 24}) * 3 + 1).to(type);
    const at::Tensor residual = at::randn({2, 5, 24}).to(type);
    const at::Tensor weight = at::randn({24}).to(type);
    const at::Tensor bias = at::randn({24}).to(type);
    const auto [sum, normed] = AddLayerNorm(x, residual, weight, bias, 1e-5);
    const at::Tensor want_sum = x + residual;
    EXPECT_TRUE(at::equal(sum, want_sum)) << type;
    EXPECT_TRUE(at::equal(normed, at::layer_norm(want_sum, {24}, weight, bias, 1e-5))) << type;
    EXPECT_TRUE(
        at::equal(LayerNorm(x, weight, bias, 1e-5), at::layer_norm(x, {24}, weight, bias, 1e-5)))
        << type;
  }
  // Unit weight, zero bias: each row has mean 0 and variance 1 (up to eps).
  const at::Tensor normed =
      LayerNorm(at::randn({4, 64}) * 5 + 2, at::ones({64}), at::zeros({64}), 0.0);
  EXPECT_LT(normed.mean(-1).abs().max().item<float>(), 1e-5);
  EXPECT_LT((normed.var(-1, /*unbiased=*/false) - 1).abs().max().item<float>(), 1e-4);
}

TEST(LayerNormOp, OutputsAreContiguousWhateverTheInputs) {
  torch::manual_seed(38);
  // Token streams as transposed views, as a traced graph may hand them over.
  const at::Tensor x = at::randn({2, 16, 6}).transpose(1, 2);
  const at::Tensor residual = at::randn({2, 16, 6}).transpose(1, 2);
  const at::Tensor weight = at::randn({16});
  const at::Tensor bias = at::randn({16});
  const auto [sum, normed] = AddLayerNorm(x, residual, weight, bias, 1e-6);
  EXPECT_TRUE(sum.is_contiguous());
  EXPECT_TRUE(normed.is_contiguous());
  EXPECT_TRUE(at::equal(sum, x + residual));
  EXPECT_TRUE(at::allclose(normed, at::layer_norm(x + residual, {16}, weight, bias, 1e-6)));
  EXPECT_TRUE(LayerNorm(x, weight, bias, 1e-6).is_contiguous());
}

TEST(LayerNormOp, BadArgumentsAreNamed) {
  const at::Tensor x = at::zeros({2, 3, 8});
  const at::Tensor w = at::ones({8});
  const at::Tensor b = at::zeros({8});
  EXPECT_NE(ErrorOf([&] { LayerNorm(x, at::ones({7}), b, 1e-5); }).find("rows have 8 values"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerNorm(x, w, at::zeros({2, 4}), 1e-5);
            }).find("bias is [2, 4]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { LayerNorm(x, w, b, -1.0); }).find("must be >= 0"), std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              AddLayerNorm(x, at::zeros({2, 8}), w, b, 1e-5);
            }).find("residual is [2, 8]"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { AddLayerNorm(x, x.to(at::kHalf), w, b, 1e-5); }).find("must share a dtype"),
      std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              LayerNorm(at::zeros({2, 8}, at::kInt), w.to(at::kInt), b.to(at::kInt), 1e-5);
            }).find("x must be floating-point"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { LayerNorm(x, w.to(at::kMeta), b, 1e-5); }).find("must be on one device"),
            std::string::npos);
}

TEST(LayerNormOp, MetaGivesTheOutputShapes) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor x = at::empty({4, 9, 32}, meta);
  const auto [sum, normed] = AddLayerNorm(x, at::empty({4, 9, 32}, meta), at::empty({32}, meta),
                                          at::empty({32}, meta), 1e-5);
  EXPECT_EQ(sum.sizes(), (std::vector<int64_t>{4, 9, 32}));
  EXPECT_TRUE(sum.is_meta() && normed.is_meta());
  EXPECT_EQ(normed.sizes(), sum.sizes());
  EXPECT_TRUE(LayerNorm(x, at::empty({32}, meta), at::empty({32}, meta), 1e-5).is_meta());
}

}  // namespace
}  // namespace qpool::quant
