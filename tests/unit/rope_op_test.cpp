// qpool::rope on the CPU (Note [Rotary embedding op]): the schema the exporter traces, the
// rotation of each channel pair with float32 products rounded before their sum, and errors that
// name the argument.
#include "quant/rope_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

#include "testing/c10_error.h"
#include "testing/test_paths.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

TEST(RopeOp, SchemaMatchesTheExporter) {
  const auto& op = c10::Dispatcher::singleton().findSchemaOrThrow("qpool::rope", "");
  std::ostringstream printed;
  printed << op.schema();
  EXPECT_EQ(printed.str(), std::string("qpool::") + kRopeSchema);
  const std::string path =
      testing::SourceDir() + "/tools/qpool_export/qpool_export/flux_transformer.py";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::string line, python;
  while (std::getline(in, line)) {
    if (line.rfind("ROPE_SCHEMA = \"", 0) == 0) {
      const size_t start = line.find('"') + 1;
      python = line.substr(start, line.find('"', start) - start);
    }
  }
  EXPECT_EQ(python, kRopeSchema) << "ROPE_SCHEMA in " << path;
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

}  // namespace
}  // namespace qpool::quant
