// qpool::geglu on the CPU (Note [GEGLU op]): the schema the exporter traces, the unfused
// operations' values, and errors that name the problem.
#include "quant/geglu_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(GegluOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::geglu"), std::string("qpool::") + kGegluSchema);
  EXPECT_EQ(testing::ExporterSchema("GEGLU_SCHEMA", "blocks.py"), kGegluSchema);
}

TEST(GegluOp, MultipliesTheValueByTheGeluOfTheGate) {
  torch::manual_seed(29);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    // x as a view whose rows are not contiguous, as a traced graph may hand it over.
    const at::Tensor x = at::randn({2, 3, 25}).to(type).slice(2, 1, 23);
    const at::Tensor got = Geglu(x);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 11})) << type;
    EXPECT_TRUE(at::equal(got, x.slice(2, 0, 11) * at::gelu(x.slice(2, 11)))) << type;
  }
  // The exact GELU: gelu(1) = 0.8413447 (Phi(1)), gelu(-1) = -0.1586553, gelu(0) = 0.
  const at::Tensor got = Geglu(at::tensor({2.f, 3.f, 5.f, 1.f, -1.f, 0.f}));
  EXPECT_NEAR(got[0].item<float>(), 2 * 0.8413447f, 1e-6);
  EXPECT_NEAR(got[1].item<float>(), 3 * -0.1586553f, 1e-6);
  EXPECT_EQ(got[2].item<float>(), 0.f);
}

TEST(GegluOp, BadArgumentsAreNamed) {
  EXPECT_NE(ErrorOf([] { Geglu(at::zeros({2, 3})); }).find("must be even"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Geglu(at::zeros({2, 4}, at::kInt));
            }).find("x must be floating-point"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Geglu(at::zeros({})); }).find("at least one dimension"),
            std::string::npos);
}

TEST(GegluOp, MetaGivesTheOutputShape) {
  const at::Tensor got = Geglu(at::empty({4, 7, 10}, at::TensorOptions().device(at::kMeta)));
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, 7, 5}));
  EXPECT_TRUE(got.is_meta());
}

}  // namespace
}  // namespace qpool::quant
