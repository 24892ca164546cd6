// qpool::bias_residual on the CPU (Note [Convolution biases]): the schema the exporter traces,
// the two ATen additions' values, and errors that name the problem.
#include "quant/bias_residual_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(BiasResidualOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::bias_residual"),
            std::string("qpool::") + kBiasResidualSchema);
  EXPECT_EQ(testing::ExporterSchema("BIAS_RESIDUAL_SCHEMA", "blocks.py"), kBiasResidualSchema);
}

TEST(BiasResidualOp, AddsTheBiasThenTheResidual) {
  torch::manual_seed(31);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    for (at::MemoryFormat format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
      const at::Tensor x = at::randn({2, 6, 3, 5}).to(type).contiguous(format);
      const at::Tensor bias = at::randn({6}).to(type);
      const at::Tensor residual = at::randn({2, 6, 3, 5}).to(type).contiguous(format);
      const at::Tensor got = BiasResidual(x, bias, residual);
      EXPECT_TRUE(at::equal(got, residual + (x + bias.view({1, 6, 1, 1})))) << type;
    }
  }
  // The result is laid out as x, whatever the residual's layout (the Meta kernel's promise).
  for (at::MemoryFormat format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
    const at::MemoryFormat other = format == at::MemoryFormat::Contiguous
                                       ? at::MemoryFormat::ChannelsLast
                                       : at::MemoryFormat::Contiguous;
    const at::Tensor x = at::randn({2, 6, 3, 5}).contiguous(format);
    const at::Tensor residual = at::randn({2, 6, 3, 5}).contiguous(other);
    const at::Tensor got = BiasResidual(x, at::randn({6}), residual);
    EXPECT_TRUE(got.is_contiguous(format));
    EXPECT_EQ(got.strides(), at::empty_like(x).strides());
  }
  // The bias goes to the channel dimension: channel 1 of every pixel gets 10.
  const at::Tensor got =
      BiasResidual(at::zeros({1, 2, 2, 2}), at::tensor({0.f, 10.f}), at::ones({1, 2, 2, 2}));
  EXPECT_TRUE(at::equal(got[0][0], at::ones({2, 2})));
  EXPECT_TRUE(at::equal(got[0][1], at::full({2, 2}, 11.f)));
}

TEST(BiasResidualOp, BadArgumentsAreNamed) {
  const at::Tensor x = at::zeros({2, 4, 3, 3});
  EXPECT_NE(ErrorOf([&] { BiasResidual(x, at::zeros({3}), x); }).find("x has 4 channels"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              BiasResidual(x, at::zeros({4}), at::zeros({2, 4, 3, 2}));
            }).find("residual is [2, 4, 3, 2]"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { BiasResidual(x, at::zeros({4}, at::kHalf), x); }).find("must share a dtype"),
      std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              BiasResidual(at::zeros({2, 4}, at::kInt), at::zeros({4}, at::kInt),
                           at::zeros({2, 4}, at::kInt));
            }).find("x must be floating-point"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              BiasResidual(at::zeros({4}), at::zeros({4}), at::zeros({4}));
            }).find("channel dimension"),
            std::string::npos);
}

TEST(BiasResidualOp, MetaGivesTheOutputShape) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor got = BiasResidual(at::empty({4, 8, 5, 5}, meta), at::empty({8}, meta),
                                      at::empty({4, 8, 5, 5}, meta));
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, 8, 5, 5}));
  EXPECT_TRUE(got.is_meta());
}

}  // namespace
}  // namespace qpool::quant
