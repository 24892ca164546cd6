// qpool::ada_norm on the CPU (Note [Modulated norm op]): the schema the exporter traces, the
// unfused operations' values, and errors that name the argument.
#include "quant/ada_norm_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(AdaNormOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::ada_norm"), std::string("qpool::") + kAdaNormSchema);
  EXPECT_EQ(testing::ExporterSchema("ADA_NORM_SCHEMA"), kAdaNormSchema);
}

TEST(AdaNormOp, NormsThenModulates) {
  torch::manual_seed(24);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = (at::randn({2, 5, 16}) * 4 + 2).to(type);
    // shift and scale as chunks of one modulation output, as AdaNorm's linear gives them.
    const at::Tensor mod = at::randn({2, 3 * 16}).to(type);
    const at::Tensor shift = mod.slice(1, 0, 16), scale = mod.slice(1, 16, 32);
    const at::Tensor got = AdaNorm(x, shift, scale, 1e-6);
    const at::Tensor normed = at::layer_norm(x, {16}, {}, {}, 1e-6);
    EXPECT_TRUE(at::equal(got, at::addcmul(shift.unsqueeze(1), normed, scale.unsqueeze(1) + 1)))
        << type;
  }
  // Zero shift and scale leave each row at mean 0 and variance 1.
  const at::Tensor x = at::randn({1, 3, 32}) * 7 - 3;
  const at::Tensor got = AdaNorm(x, at::zeros({1, 32}), at::zeros({1, 32}), 0);
  EXPECT_TRUE(at::allclose(got.mean(-1), at::zeros({1, 3}), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(got.var(-1, /*unbiased=*/false), at::ones({1, 3}), 1e-4, 1e-4));
}

TEST(AdaNormOp, BadArgumentsAreNamed) {
  const at::Tensor x = at::zeros({2, 5, 8}), v = at::zeros({2, 8});
  EXPECT_NE(ErrorOf([&] {
              AdaNorm(at::zeros({5, 8}), v, v, 1e-6);
            }).find("[B, N, D]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              AdaNorm(x, at::zeros({1, 8}), v, 1e-6);
            }).find("shift must be [2, 8] for x of [2, 5, 8]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { AdaNorm(x, v, v.to(at::kHalf), 1e-6); }).find("scale is Half, x Float"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { AdaNorm(x.to(at::kInt), v, v, 1e-6); }).find("x must be float32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { AdaNorm(x, v, v, -1); }).find("eps must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace qpool::quant
