// The w8a8 format on the CPU: its layout, its quantizer, and qpool::quant_linear's int8 x int8
// product (Note [W8A8 linear]) against a float reference with its error bound, against an exact
// integer reference, and its weight-only fallback.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "quant/quant_format.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "quant/w8a8_linear.h"
#include "testing/c10_error.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

QuantState W8A8(const at::Tensor& w, const at::Tensor& smooth = {}) {
  StatusOr<QuantState> s = QuantizeW8A8(w, smooth);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

QuantState Int8(const at::Tensor& w) {
  StatusOr<QuantState> s = QuantizeInt8(w);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

// Note [W8A8 linear], error bound: quantizing a row of xs = x / s moves each value by at most
// a_r / 254 (a_r its largest |value|), and the weight of w * s by at most absmax_n / 254, so
// |y - x w^T| <= a_r / 254 * sum_k |w_hat * s| + absmax_n / 254 * sum_k |xs|, plus float32
// rounding (1e-5 of sum_k |xs| |w * s|). x is [M, K].
at::Tensor ErrorBound(const at::Tensor& x, const QuantState& s) {
  const at::Tensor xs = x.div(s.code);
  const at::Tensor ws = s.weight.to(at::kFloat).mul(s.absmax.div(127).unsqueeze(1));
  const at::Tensor a = xs.abs().amax(1, true);
  return a.div(254).mul(ws.abs().sum(1)) + s.absmax.div(254).mul(xs.abs().sum(1, true)) +
         xs.abs().matmul(ws.abs().t()).mul(1e-5) + 1e-6;
}

TEST(W8A8Format, ParsesAndInspects) {
  ASSERT_TRUE(ParseQuantFormat("w8a8").ok());
  EXPECT_EQ(*ParseQuantFormat("w8a8"), QuantFormat::kW8A8);
  EXPECT_STREQ(QuantFormatName(QuantFormat::kW8A8), "w8a8");
  EXPECT_NE(ParseQuantFormat("w8").status().message().find("w8a8"), std::string::npos);

  QuantState s = W8A8(at::randn({8, 24}));
  const QuantLayout layout = InspectQuantState(s, 24, "t");
  EXPECT_EQ(layout.format, QuantFormat::kW8A8);
  EXPECT_EQ(layout.row_bytes, 24);
  QuantState int8 = s;
  int8.code = EmptyState();
  EXPECT_EQ(InspectQuantState(int8, 24, "t").format, QuantFormat::kInt8);
  // The error InspectQuantState gives for s with one tensor replaced.
  auto error_with = [&s](at::Tensor QuantState::*slot, const at::Tensor& t) {
    QuantState bad = s;
    bad.*slot = t;
    return ErrorOf([&] { InspectQuantState(bad, 24, "layer"); });
  };
  EXPECT_NE(error_with(&QuantState::code, at::ones({16}))
                .find("layer: w8a8 code (activation scales) must be float32 [24]"),
            std::string::npos);
  EXPECT_NE(error_with(&QuantState::code, at::ones({24}, at::kHalf)).find("float32 [24]"),
            std::string::npos);
  EXPECT_NE(
      error_with(&QuantState::offset, at::zeros({1})).find("offset must be empty for format w8a8"),
      std::string::npos);
}

TEST(W8A8Quantizer, IsInt8OfTheSmoothedWeight) {
  torch::manual_seed(31);
  const at::Tensor w = at::randn({24, 40}) * 0.1;
  const QuantState plain = W8A8(w), int8 = Int8(w);
  EXPECT_TRUE(at::equal(plain.weight, int8.weight));
  EXPECT_TRUE(at::equal(plain.absmax, int8.absmax));
  EXPECT_TRUE(at::equal(plain.code, at::ones({40})));
  const at::Tensor s = at::rand({40}) + 0.5;
  const QuantState smoothed = W8A8(w, s);
  EXPECT_TRUE(at::equal(smoothed.weight, Int8(w * s).weight));
  EXPECT_TRUE(at::equal(smoothed.code, s));
  // Dequantize undoes the smoothing: |w_hat - w| * s within half a step of w * s per row.
  const at::Tensor err = (Dequantize(smoothed, 40) - w).abs().mul(s).amax(1);
  EXPECT_TRUE((err <= smoothed.absmax / 254 * (1 + 1e-5) + 1e-7).all().item<bool>());
  // Through the dispatcher too.
  StatusOr<QuantState> q = Quantize(w, QuantOptions{QuantFormat::kW8A8});
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(at::equal(q->weight, plain.weight));

  StatusOr<QuantState> bad = QuantizeW8A8(w, at::ones({39}), "unet.proj");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unet.proj: w8a8 activation scales must be [40]"),
            std::string::npos);
  at::Tensor zero = at::ones({40});
  zero[7] = 0;
  EXPECT_NE(QuantizeW8A8(w, zero).status().message().find("positive and finite"),
            std::string::npos);
  EXPECT_FALSE(QuantizeW8A8(at::ones({4, 4}, at::kInt)).ok());
}

TEST(W8A8Linear, IntProductIsWithinTheBoundOfTheFloatLayer) {
  torch::manual_seed(32);
  struct Shape {
    int64_t m, k, n;
  };
  for (Shape sh : {Shape{17, 64, 24}, Shape{40, 256, 64}, Shape{128, 32, 8}, Shape{77, 320, 40}}) {
    SCOPED_TRACE("M=" + std::to_string(sh.m) + " K=" + std::to_string(sh.k) +
                 " N=" + std::to_string(sh.n));
    ASSERT_TRUE(W8A8IntMatmulRuns(sh.m, sh.k, sh.n));
    const at::Tensor w = at::randn({sh.n, sh.k}) * 0.05;
    at::Tensor x = at::randn({sh.m, sh.k}) * 3;
    x.select(1, 3).mul_(20);  // an outlier channel
    for (bool smooth : {false, true}) {
      const QuantState s = smooth ? W8A8(w, at::rand({sh.k}) + 0.5) : W8A8(w);
      const at::Tensor y = QuantLinear(x, s);
      const at::Tensor ref = at::linear(x, w);
      EXPECT_TRUE(((y - ref).abs() <= ErrorBound(x, s)).all().item<bool>()) << smooth;
      // The int32 product is exact: a float64 product of the same int8 values gives it too.
      const at::Tensor xs = x.div(s.code);
      const at::Tensor amax = xs.abs().amax(1);
      const at::Tensor acc =
          RowsToInt8(xs, amax).to(at::kDouble).matmul(s.weight.to(at::kDouble).t());
      const at::Tensor exact =
          acc.to(at::kFloat).mul(amax.div(127).unsqueeze(1)).mul(s.absmax.div(127));
      EXPECT_TRUE(at::equal(y, exact)) << smooth;
    }
  }
}

// Measured on this build (K = 256, N = 64, M = 64, Gaussian x and w): mean |error| 1.0% of mean
// |y| for w8a8, 0.7% for weight-only int8; the bound keeps 50% headroom.
TEST(W8A8Linear, ErrorOnGaussianDataIsSmall) {
  torch::manual_seed(33);
  const at::Tensor w = at::randn({64, 256}) * 0.05;
  const at::Tensor x = at::randn({64, 256});
  const at::Tensor bias = at::randn({64});
  const at::Tensor ref = at::linear(x, w, bias);
  const double scale = (ref - bias).abs().mean().item<double>();
  const double w8a8 = (QuantLinear(x, W8A8(w), bias) - ref).abs().mean().item<double>() / scale;
  const double int8 = (QuantLinear(x, Int8(w), bias) - ref).abs().mean().item<double>() / scale;
  std::printf("W8A8_RELATIVE_ERROR w8a8 %.5f int8 %.5f\n", w8a8, int8);
  EXPECT_LT(w8a8, 0.015);
  EXPECT_LT(int8, w8a8);
}

TEST(W8A8Linear, FallsBackToWeightOnlyInt8) {
  torch::manual_seed(34);
  struct Case {
    std::vector<int64_t> lead;
    int64_t k, n;
  };
  // M = 16 rows; K = 36; N = 12; M = 3.
  for (const Case& c :
       {Case{{2, 8}, 64, 16}, Case{{40}, 36, 16}, Case{{20}, 64, 12}, Case{{3, 1}, 64, 16}}) {
    std::vector<int64_t> shape = c.lead;
    shape.push_back(c.k);
    const at::Tensor x = at::randn(shape);
    const at::Tensor w = at::randn({c.n, c.k});
    const at::Tensor bias = at::randn({c.n});
    EXPECT_FALSE(W8A8IntMatmulRuns(x.numel() / c.k, c.k, c.n));
    const QuantState s = W8A8(w), int8 = Int8(w);
    EXPECT_TRUE(at::equal(QuantLinear(x, s, bias), QuantLinear(x, int8, bias)));
    for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      const at::Tensor y = QuantLinear(x.to(dt), s, bias);
      EXPECT_EQ(y.scalar_type(), dt);
      EXPECT_TRUE(at::equal(y, QuantLinear(x.to(dt), int8, bias)));
    }
    // With activation scales: the int8 op on x / s.
    const at::Tensor smooth = at::rand({c.k}) + 0.5;
    const QuantState smoothed = W8A8(w, smooth);
    QuantState as_int8 = smoothed;
    as_int8.code = EmptyState();
    EXPECT_TRUE(
        at::equal(QuantLinear(x, smoothed, bias), QuantLinear(x.div(smooth), as_int8, bias)));
  }
}

TEST(W8A8Linear, ZeroRowsGiveTheBiasAndDtypesFollowX) {
  torch::manual_seed(35);
  const at::Tensor bias = at::randn({16});
  const QuantState s = W8A8(at::randn({16, 32}));
  at::Tensor x = at::randn({2, 10, 32});
  x[0][5].zero_();
  const at::Tensor y = QuantLinear(x, s, bias);
  EXPECT_EQ(y.sizes(), at::IntArrayRef({2, 10, 16}));
  EXPECT_TRUE(at::equal(y[0][5], bias));
  EXPECT_TRUE(at::isfinite(y).all().item<bool>());
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    const at::Tensor yd = QuantLinear(x.to(dt), s, bias);
    EXPECT_EQ(yd.scalar_type(), dt);
    EXPECT_LT((yd.to(at::kFloat) - y).abs().max().item<float>(),
              0.05 * y.abs().max().item<float>());
  }
}

TEST(W8A8Linear, ErrorsNameTheTensor) {
  QuantState s = W8A8(at::randn({8, 32}));
  s.code = s.code.to(at::kMeta);
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::randn({20, 32}), s);
            }).find("code is on meta but x is on cpu"),
            std::string::npos);
  QuantState meta{
      s.weight.to(at::kMeta),        s.absmax.to(at::kMeta),      s.code,
      s.nested_absmax.to(at::kMeta), s.nested_code.to(at::kMeta), s.offset.to(at::kMeta)};
  const at::Tensor y =
      QuantLinear(at::empty({3, 20, 32}, at::TensorOptions().device(at::kMeta)), meta);
  EXPECT_EQ(y.sizes(), at::IntArrayRef({3, 20, 8}));
  QuantState wrong = W8A8(at::randn({8, 32}));
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::randn({20, 16}), wrong);
            }).find("w8a8 weight is [8, 32] but the input has 16 features"),
            std::string::npos);
}

}  // namespace
}  // namespace qpool::quant
