// qpool::cat_gelu on the CPU (Note [Joined GELU op]): the schema the exporter traces, the unfused
// operations' values, and errors that name the argument.
#include "quant/cat_gelu_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(CatGeluOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::cat_gelu"), std::string("qpool::") + kCatGeluSchema);
  EXPECT_EQ(testing::ExporterSchema("CAT_GELU_SCHEMA"), kCatGeluSchema);
}

TEST(CatGeluOp, JoinsAWithTheGeluOfB) {
  torch::manual_seed(23);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor a = at::randn({2, 3, 5}).to(type);
    // b as a view of a wider projection's output, as the MLP branch is of the fused one.
    const at::Tensor b = at::randn({2, 3, 19}).to(type).slice(2, 7);
    const at::Tensor got = CatGelu(a, b);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 17}));
    EXPECT_TRUE(at::equal(got.slice(2, 0, 5), a)) << type;
    EXPECT_TRUE(at::equal(got.slice(2, 5), at::gelu(b, "tanh"))) << type;
  }
  // The tanh approximation: gelu(0) = 0, gelu(x) -> x for large x, -> 0 for very negative x.
  const at::Tensor b = at::tensor({0.f, 10.f, -10.f});
  const at::Tensor got = CatGelu(at::zeros({0}), b);
  EXPECT_EQ(got[0].item<float>(), 0.f);
  EXPECT_NEAR(got[1].item<float>(), 10.f, 1e-5);
  EXPECT_NEAR(got[2].item<float>(), 0.f, 1e-5);
}

TEST(CatGeluOp, BadArgumentsAreNamed) {
  const at::Tensor a = at::zeros({2, 3, 4});
  EXPECT_NE(ErrorOf([&] {
              CatGelu(a, at::zeros({2, 4, 4}));
            }).find("only the last dimension"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              CatGelu(a, at::zeros({2, 3, 4}, at::kHalf));
            }).find("a is Float, b Half"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { CatGelu(a.to(at::kInt), a); }).find("a must be float32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { CatGelu(a, at::zeros({}, at::kFloat)); }).find("b must have at least"),
            std::string::npos);
}

}  // namespace
}  // namespace qpool::quant
