// qpool::rope and qpool::rms_rope on the CPU (Notes [Rotary embedding op], [Normed rotary
// embedding op]): the schemas the exporter traces, the rotation of each channel pair with float32
// products rounded before their sum, the norms joined and rotated, and errors that name the
// argument.
#include "quant/rope_op.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "testing/c10_error.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(RopeOp, SchemasMatchTheExporter) {
  EXPECT_EQ(testing::RegisteredSchema("qpool::rope"), std::string("qpool::") + kRopeSchema);
  EXPECT_EQ(testing::ExporterSchema("ROPE_SCHEMA"), kRopeSchema);
  EXPECT_EQ(testing::RegisteredSchema("qpool::rms_rope"), std::string("qpool::") + kRmsRopeSchema);
  EXPECT_EQ(testing::ExporterSchema("RMS_ROPE_SCHEMA"), kRmsRopeSchema);
}

// Each pair (a, b) -> (a c - b s, b c + a s) with the pair's own table entries, written out
// value by value in float32: products rounded, then the sum, then the cast.
at::Tensor ByHand(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty_like(xf);
  const at::Tensor ct = cos.reshape({x.size(1), x.size(3)}).contiguous();
  const at::Tensor st = sin.reshape({x.size(1), x.size(3)}).contiguous();
  const auto c = ct.accessor<float, 2>();
  const auto s = st.accessor<float, 2>();
  const auto in = xf.accessor<float, 4>();
  auto o = out.accessor<float, 4>();
  for (int64_t b = 0; b < x.size(0); ++b) {
    for (int64_t n = 0; n < x.size(1); ++n) {
      for (int64_t h = 0; h < x.size(2); ++h) {
        for (int64_t d = 0; d < x.size(3); d += 2) {
          const float a = in[b][n][h][d], v = in[b][n][h][d + 1];
          // volatile: each product rounded to float32 before the sum (no contraction).
          const volatile float p0 = a * c[n][d];
          const volatile float p1 = -v * s[n][d];
          const volatile float p2 = v * c[n][d + 1];
          const volatile float p3 = a * s[n][d + 1];
          o[b][n][h][d] = p0 + p1;
          o[b][n][h][d + 1] = p2 + p3;
        }
      }
    }
  }
  return out.to(x.scalar_type());
}

TEST(RopeOp, RotatesEachChannelPairInFloat32) {
  torch::manual_seed(21);
  const at::Tensor angles = at::rand({1, 7, 1, 6}) * 20;
  const at::Tensor cos = at::cos(angles), sin = at::sin(angles);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = at::randn({2, 7, 3, 6}).to(type);
    const at::Tensor got = Rope(x, cos, sin);
    EXPECT_EQ(got.scalar_type(), type);
    EXPECT_TRUE(at::equal(got, ByHand(x, cos, sin))) << type;
  }
  // A rotation by 0 is the identity; by a quarter turn, (a, b) -> (-b, a).
  const at::Tensor x = at::randn({1, 7, 3, 6});
  EXPECT_TRUE(at::equal(Rope(x, at::ones({1, 7, 1, 6}), at::zeros({1, 7, 1, 6})), x));
  const at::Tensor quarter = Rope(x, at::zeros({1, 7, 1, 6}), at::ones({1, 7, 1, 6}));
  const at::Tensor pairs = x.unflatten(-1, {-1, 2});
  EXPECT_TRUE(at::equal(quarter.unflatten(-1, {-1, 2}).select(-1, 0), -pairs.select(-1, 1)));
  EXPECT_TRUE(at::equal(quarter.unflatten(-1, {-1, 2}).select(-1, 1), pairs.select(-1, 0)));
}

TEST(RopeOp, BadArgumentsAreNamed) {
  const at::Tensor table = at::zeros({1, 5, 1, 8});
  EXPECT_NE(ErrorOf([&] {
              Rope(at::zeros({2, 5, 3, 7}), at::zeros({1, 5, 1, 7}), at::zeros({1, 5, 1, 7}));
            }).find("must be even"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              Rope(at::zeros({5, 3, 8}), table, table);
            }).find("[B, N, H, D]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              Rope(at::zeros({2, 5, 3, 8}, at::kInt), table, table);
            }).find("float32, float16 or bfloat16"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              Rope(at::zeros({2, 5, 3, 8}), table.to(at::kHalf), table);
            }).find("cos must be float32"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              Rope(at::zeros({2, 6, 3, 8}), table, table);
            }).find("cos must be [1, 6, 1, 8]"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              Rope(at::zeros({2, 5, 3, 8}), table, at::zeros({5, 8}));
            }).find("sin must be"),
            std::string::npos);
}

// Note [Normed rotary embedding op]: the CPU kernel is the unfused graph's operations, so an
// export's CPU outputs are unchanged by the fusion.
TEST(RmsRopeOp, EqualsTheNormsJoinedAndRotated) {
  torch::manual_seed(22);
  const at::Tensor angles = at::rand({1, 9, 1, 8}) * 20;
  const at::Tensor cos = at::cos(angles), sin = at::sin(angles);
  for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor text = at::randn({2, 4, 3, 8}).to(type);
    // The image part as a view of a wider projection, as q is of a fused q / k / v.
    const at::Tensor image =
        at::randn({2, 5, 3 * 8 * 2}).to(type).slice(2, 0, 24).unflatten(-1, {3, 8});
    ASSERT_FALSE(image.is_contiguous());
    const at::Tensor wt = at::randn({8}).to(type), wi = at::randn({8}).to(type);
    const at::Tensor got = RmsRope({text, image}, {wt, wi}, 1e-6, cos, sin);
    const at::Tensor want =
        Rope(at::cat({at::rms_norm(text, {8}, wt, 1e-6), at::rms_norm(image, {8}, wi, 1e-6)}, 1),
             cos, sin);
    EXPECT_EQ(got.scalar_type(), type);
    EXPECT_TRUE(at::equal(got, want)) << type;
    // One part: the norm and the rotation of its tokens alone.
    const at::Tensor one = RmsRope({image}, {wi}, 1e-6, cos.slice(1, 4), sin.slice(1, 4));
    EXPECT_TRUE(at::equal(one, want.slice(1, 4))) << type;
  }
  // A unit weight and no rotation leave each head vector at root-mean-square 1.
  const at::Tensor x = at::randn({1, 3, 2, 8}) * 5;
  const at::Tensor normed =
      RmsRope({x}, {at::ones({8})}, 0, at::ones({1, 3, 1, 8}), at::zeros({1, 3, 1, 8}));
  EXPECT_TRUE(at::allclose(normed.pow(2).mean(-1), at::ones({1, 3, 2}), 1e-5, 1e-5));
}

TEST(RmsRopeOp, BadArgumentsAreNamed) {
  const at::Tensor x = at::zeros({2, 5, 3, 8}), w = at::ones({8}), table = at::zeros({1, 5, 1, 8});
  const auto error = [&](auto&& call) { return ErrorOf(call); };
  EXPECT_NE(error([&] { RmsRope({}, {}, 1e-6, table, table); }).find("xs is empty"),
            std::string::npos);
  EXPECT_NE(error([&] {
              RmsRope({x}, {w, w}, 1e-6, table, table);
            }).find("1 parts but 2"),
            std::string::npos);
  EXPECT_NE(error([&] {
              RmsRope({x}, {at::ones({4})}, 1e-6, table, table);
            }).find("weights[0] must be a float [8]"),
            std::string::npos);
  EXPECT_NE(error([&] {
              RmsRope({x, x.to(at::kHalf)}, {w, w}, 1e-6, table, table);
            }).find("xs[1] is Half, xs[0] Float"),
            std::string::npos);
  EXPECT_NE(error([&] {
              RmsRope({x, at::zeros({2, 5, 4, 8})}, {w, w}, 1e-6, table, table);
            }).find("only the token counts may differ"),
            std::string::npos);
  // The tables cover the joined tokens: 5 + 5.
  EXPECT_NE(error([&] {
              RmsRope({x, x}, {w, w}, 1e-6, table, table);
            }).find("cos must be [1, 10, 1, 8]"),
            std::string::npos);
  EXPECT_NE(error([&] { RmsRope({x}, {w}, -1, table, table); }).find("eps must be >= 0"),
            std::string::npos);
  EXPECT_NE(error([&] {
              RmsRope({at::zeros({2, 5, 3, 7})}, {at::ones({7})}, 1e-6, table, table);
            }).find("must be even"),
            std::string::npos);
}

}  // namespace
}  // namespace qpool::quant
