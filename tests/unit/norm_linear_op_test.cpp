// qpool::layer_norm_quant_linear and qpool::add_layer_norm_quant_linear on the CPU (Note [Norm
// linear op]): the schemas the exporter traces, the two ops' bytes on every weight format, and
// errors that name the problem.
#include "quant/norm_linear_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "quant/layer_norm_op.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "testing/c10_error.h"
#include "testing/op_schemas.h"
#include "testing/quant_states.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(NormQuantLinearOp, SchemasMatchTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::layer_norm_quant_linear"),
            std::string("qpool::") + kLayerNormQuantLinearSchema);
  EXPECT_EQ(testing::ExporterSchema("LAYER_NORM_QUANT_LINEAR_SCHEMA", "quant.py"),
            kLayerNormQuantLinearSchema);
  EXPECT_EQ(testing::RegisteredSchema("qpool::add_layer_norm_quant_linear"),
            std::string("qpool::") + kAddLayerNormQuantLinearSchema);
  EXPECT_EQ(testing::ExporterSchema("ADD_LAYER_NORM_QUANT_LINEAR_SCHEMA", "quant.py"),
            kAddLayerNormQuantLinearSchema);
}

TEST(NormQuantLinearOp, EqualsTheNormThenTheLinearOnEveryFormat) {
  torch::manual_seed(37);
  const int64_t d = 64, n = 48;
  const double eps = 1e-5;
  const at::Tensor w = at::randn({n, d}) * 0.1;
  const at::Tensor bias = at::randn({n});
  for (const auto& [name, s] : testing::EveryFormat(w)) {
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor gamma = (at::rand({d}) + 0.5).to(type);
      const at::Tensor beta = at::randn({d}).to(type);
      // 2 x 20 rows: the w8a8 product runs in int8 (17 rows or more); 3 rows: its fallback.
      for (int64_t rows : {20, 3}) {
        SCOPED_TRACE(name + " " + c10::toString(type) + " rows " + std::to_string(rows));
        const at::Tensor x = (at::randn({2, rows, d}) * 2).to(type);
        const at::Tensor r = at::randn({2, rows, d}).to(type);
        const at::Tensor got = LayerNormQuantLinear(x, gamma, beta, eps, s, bias);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, rows, n}));
        EXPECT_EQ(got.scalar_type(), type);
        EXPECT_TRUE(at::equal(got, QuantLinear(LayerNorm(x, gamma, beta, eps), s, bias)));
        const auto [sum, out] = AddLayerNormQuantLinear(x, r, gamma, beta, eps, s);
        const auto [want_sum, normed] = AddLayerNorm(x, r, gamma, beta, eps);
        EXPECT_TRUE(at::equal(sum, want_sum));
        EXPECT_TRUE(at::equal(out, QuantLinear(normed, s)));
      }
    }
  }
}

TEST(NormQuantLinearOp, BadArgumentsAreNamed) {
  const QuantState s = *QuantizeW8A8(at::randn({8, 16}));
  const at::Tensor gamma = at::ones({16}), beta = at::zeros({16});
  // The norm's weight does not fit x.
  const std::string norm = ErrorOf([&] {
    LayerNormQuantLinear(at::zeros({2, 16}), at::ones({12}), beta, 1e-5, s);
  });
  EXPECT_NE(norm.find("qpool::layer_norm_quant_linear"), std::string::npos) << norm;
  // The linear reads 16 values; x's rows hold 12.
  const std::string width = ErrorOf([&] {
    LayerNormQuantLinear(at::zeros({2, 12}), at::ones({12}), at::zeros({12}), 1e-5, s);
  });
  EXPECT_NE(width.find("quant_linear"), std::string::npos) << width;
  const std::string residual = ErrorOf([&] {
    AddLayerNormQuantLinear(at::zeros({2, 16}), at::zeros({3, 16}), gamma, beta, 1e-5, s);
  });
  EXPECT_NE(residual.find("qpool::add_layer_norm_quant_linear"), std::string::npos) << residual;
  EXPECT_NE(ErrorOf([&] {
              LayerNormQuantLinear(at::zeros({2, 16}), gamma, beta, -1.0, s);
            }).find("eps"),
            std::string::npos);
}

TEST(NormQuantLinearOp, MetaGivesTheOutputShapes) {
  const at::TensorOptions meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor e = at::empty({0}, meta.dtype(at::kFloat));
  const QuantState s{at::empty({24, 16}, meta.dtype(at::kChar)), at::empty({24}, meta), e, e, e, e};
  const at::Tensor x = at::empty({4, 7, 16}, meta.dtype(at::kHalf));
  const at::Tensor gamma = at::empty({16}, meta.dtype(at::kHalf));
  const at::Tensor got = LayerNormQuantLinear(x, gamma, gamma, 1e-5, s);
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, 7, 24}));
  EXPECT_TRUE(got.is_meta());
  const auto [sum, out] = AddLayerNormQuantLinear(x, x, gamma, gamma, 1e-5, s);
  EXPECT_EQ(sum.sizes(), x.sizes());
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{4, 7, 24}));
}

}  // namespace
}  // namespace qpool::quant
