// qpool::geglu_quant_linear on the CPU (Note [GEGLU linear op]): the schema the exporter traces,
// the two ops' bytes on every weight format, and errors that name the problem.
#include "quant/geglu_linear_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "quant/geglu_op.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "testing/c10_error.h"
#include "testing/op_schemas.h"
#include "testing/quant_states.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(GegluQuantLinearOp, SchemaMatchesTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::geglu_quant_linear"),
            std::string("qpool::") + kGegluQuantLinearSchema);
  EXPECT_EQ(testing::ExporterSchema("GEGLU_QUANT_LINEAR_SCHEMA", "quant.py"),
            kGegluQuantLinearSchema);
}

TEST(GegluQuantLinearOp, EqualsTheGegluThenTheLinearOnEveryFormat) {
  torch::manual_seed(31);
  const int64_t d = 64, n = 48;
  const at::Tensor w = at::randn({n, d}) * 0.1;
  const at::Tensor bias = at::randn({n});
  for (const auto& [name, s] : testing::EveryFormat(w)) {
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
      // 2 x 20 rows: the w8a8 product runs in int8 (17 rows or more); 3 rows: its fallback.
      for (int64_t rows : {20, 3}) {
        SCOPED_TRACE(name + " " + c10::toString(type) + " rows " + std::to_string(rows));
        const at::Tensor x = (at::randn({2, rows, 2 * d}) * 2).to(type);
        const at::Tensor want = QuantLinear(Geglu(x), s, bias);
        const at::Tensor got = GegluQuantLinear(x, s, bias);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, rows, n}));
        EXPECT_EQ(got.scalar_type(), type);
        EXPECT_TRUE(at::equal(got, want));
        EXPECT_TRUE(at::equal(GegluQuantLinear(x, s), QuantLinear(Geglu(x), s)));
      }
    }
  }
}

TEST(GegluQuantLinearOp, BadArgumentsAreNamed) {
  const QuantState s = *QuantizeW8A8(at::randn({8, 16}));
  EXPECT_NE(ErrorOf([&] { GegluQuantLinear(at::zeros({2, 31}), s); }).find("must be even"),
            std::string::npos);
  // The linear reads 16 values; x's halves hold 12.
  const std::string width = ErrorOf([&] { GegluQuantLinear(at::zeros({2, 24}), s); });
  EXPECT_NE(width.find("quant_linear"), std::string::npos) << width;
  EXPECT_NE(
      ErrorOf([&] { GegluQuantLinear(at::zeros({2, 32}, at::kInt), s); }).find("floating-point"),
      std::string::npos);
}

TEST(GegluQuantLinearOp, MetaGivesTheOutputShape) {
  const at::TensorOptions meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor e = at::empty({0}, meta.dtype(at::kFloat));
  const QuantState s{at::empty({24, 16}, meta.dtype(at::kChar)), at::empty({24}, meta), e, e, e, e};
  const at::Tensor got = GegluQuantLinear(at::empty({4, 7, 32}, meta.dtype(at::kHalf)), s);
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, 7, 24}));
  EXPECT_TRUE(got.is_meta());
}

}  // namespace
}  // namespace qpool::quant
