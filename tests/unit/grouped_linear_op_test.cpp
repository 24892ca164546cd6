// qpool::grouped_quant_linear on the CPU (Note [Grouped linear op]): the schema the exporter
// traces, each group's product with its own weight on every format, and errors that name the
// problem.
#include "quant/grouped_linear_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "quant/quantizer.h"
#include "testing/c10_error.h"
#include "testing/op_schemas.h"
#include "testing/quant_states.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

at::Tensor Offs(std::vector<int> ends) {
  return at::tensor(ends, at::TensorOptions().dtype(at::kInt));
}

TEST(GroupedQuantLinearOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::grouped_quant_linear"),
            std::string("qpool::") + kGroupedQuantLinearSchema);
  EXPECT_EQ(testing::ExporterSchema("GROUPED_QUANT_LINEAR_SCHEMA", "grouped_quant.py"),
            kGroupedQuantLinearSchema);
}

TEST(GroupedQuantLinearOp, EachGroupsRowsTimesItsOwnWeightOnEveryFormat) {
  torch::manual_seed(31);
  const int64_t groups = 3, n = 24, k = 64;
  // The groups' weights stacked as one layer, quantized as one (nf4 blocks and the nested absmax
  // run across the groups' boundaries).
  const at::Tensor w = at::randn({groups * n, k}) * 0.1;
  for (const auto& [name, s] : testing::EveryFormat(w)) {
    const at::Tensor dequantized = Dequantize(s, k).view({groups, n, k});
    for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      for (const std::vector<int>& ends : {std::vector<int>{5, 5, 12}, {0, 7, 12}, {12, 12, 12}}) {
        SCOPED_TRACE(name + " " + c10::toString(type) + " ends " + std::to_string(ends[0]) + "," +
                     std::to_string(ends[1]));
        const at::Tensor x = at::randn({12, k}).to(type);
        const at::Tensor got = GroupedQuantLinear(x, Offs(ends), s);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{12, n}));
        EXPECT_EQ(got.scalar_type(), type);
        int start = 0;
        for (int g = 0; g < groups; ++g) {
          const at::Tensor rows = x.slice(0, start, ends[g]).to(at::kFloat);
          const at::Tensor want = at::matmul(rows, dequantized[g].t());
          // A float layer multiplies in x's dtype; bfloat16 rounds the sums.
          const double tol = type == at::kFloat ? 1e-5 : 0.05;
          EXPECT_TRUE(at::allclose(got.slice(0, start, ends[g]).to(at::kFloat), want, tol, tol))
              << "group " << g;
          start = ends[g];
        }
      }
    }
  }
}

TEST(GroupedQuantLinearOp, NoRowsGiveAnEmptyProduct) {
  const QuantState s = *QuantizeNf4(at::randn({16, 64}), 64, false);
  const at::Tensor got = GroupedQuantLinear(at::zeros({0, 64}), Offs({0, 0}), s);
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{0, 8}));
}

TEST(GroupedQuantLinearOp, BadArgumentsAreNamed) {
  const QuantState s = *QuantizeInt8(at::randn({16, 32}));
  const at::Tensor x = at::zeros({4, 32});
  EXPECT_NE(ErrorOf([&] {
              GroupedQuantLinear(x, Offs({2, 4}).to(at::kLong), s);
            }).find("offs must be int32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              GroupedQuantLinear(x, Offs({1, 2, 4}), s);
            }).find("for 3 groups"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              GroupedQuantLinear(at::zeros({2, 2, 32}), Offs({2, 4}), s);
            }).find("x must be [rows, in_features]"),
            std::string::npos);
  const std::string width = ErrorOf([&] {
    GroupedQuantLinear(at::zeros({4, 24}), Offs({2, 4}), s);
  });
  EXPECT_NE(width.find("quant_linear"), std::string::npos) << width;
}

TEST(GroupedQuantLinearOp, MetaGivesTheOutputShape) {
  const at::TensorOptions meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor e = at::empty({0}, meta.dtype(at::kFloat));
  const QuantState s{
      at::empty({4 * 24, 8}, meta.dtype(at::kByte)), at::empty({48}, meta), e, e, e, e};
  const at::Tensor got = GroupedQuantLinear(at::empty({9, 16}, meta.dtype(at::kBFloat16)),
                                            at::empty({4}, meta.dtype(at::kInt)), s);
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{9, 24}));
  EXPECT_TRUE(got.is_meta());
}

}  // namespace
}  // namespace qpool::quant
