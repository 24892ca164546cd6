// qpool::swiglu on the CPU (Note [SwiGLU op]): the schema the exporter traces, the unfused
// operations' values with and without a row weight, and errors that name the problem.
#include "quant/swiglu_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(SwigluOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::swiglu"), std::string("qpool::") + kSwigluSchema);
  EXPECT_EQ(testing::ExporterSchema("SWIGLU_SCHEMA", "hidream_experts.py"), kSwigluSchema);
}

TEST(SwigluOp, MultipliesTheSiluOfTheGateByTheValueAndTheWeight) {
  torch::manual_seed(31);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    // x as a view whose rows are not contiguous, as a traced graph may hand it over.
    const at::Tensor x = at::randn({2, 3, 25}).to(type).slice(2, 1, 23);
    const at::Tensor gate = x.slice(2, 0, 11), value = x.slice(2, 11);
    const at::Tensor plain = Swiglu(x, std::nullopt);
    ASSERT_EQ(plain.sizes(), (std::vector<int64_t>{2, 3, 11})) << type;
    EXPECT_TRUE(at::equal(plain, at::silu(gate) * value)) << type;
    const at::Tensor weight = at::rand({2, 3}).to(type);
    EXPECT_TRUE(at::equal(Swiglu(x, weight), at::silu(gate) * value * weight.unsqueeze(-1)))
        << type;
  }
  // silu(1) = 1 / (1 + e^-1) = 0.7310586, silu(0) = 0.
  const at::Tensor got = Swiglu(at::tensor({1.f, 0.f, 2.f, 3.f}), at::tensor(0.5f).reshape({}));
  EXPECT_NEAR(got[0].item<float>(), 0.7310586f * 2 * 0.5f, 1e-6);
  EXPECT_EQ(got[1].item<float>(), 0.f);
}

TEST(SwigluOp, BadArgumentsAreNamed) {
  EXPECT_NE(ErrorOf([] {
              Swiglu(at::zeros({2, 3}), std::nullopt);
            }).find("must be even"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Swiglu(at::zeros({2, 4}, at::kInt), std::nullopt);
            }).find("x must be floating-point"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Swiglu(at::zeros({2, 4}), at::zeros({3}));
            }).find("expected x's shape"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Swiglu(at::zeros({2, 4}), at::zeros({2}, at::kHalf));
            }).find("they must match"),
            std::string::npos);
}

TEST(SwigluOp, MetaGivesTheOutputShape) {
  const at::TensorOptions meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor got = Swiglu(at::empty({4, 7, 10}, meta), at::empty({4, 7}, meta));
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, 7, 5}));
  EXPECT_TRUE(got.is_meta());
}

}  // namespace
}  // namespace qpool::quant
