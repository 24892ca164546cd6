// Int8Conv2d (Note [Int8 convolutions]) against the same convolution in float64.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include "quant/int8_conv_cuda.h"

namespace qpool::quant::cuda {
namespace {

struct Shape {
  int64_t n, c, h, w, k, kernel, stride, padding;
  at::ScalarType out;
  bool bias;
};

class Int8ConvGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    if (!Int8ConvSupported(Int8({1, 16, 4, 4}), Int8({16, 16, 1, 1}), at::kHalf)) {
      GTEST_SKIP() << "the device is older than compute capability 8.0";
    }
  }

  static at::Tensor Int8(at::IntArrayRef sizes) {
    return at::randint(-127, 128, sizes, at::TensorOptions().device(at::kCUDA).dtype(at::kChar))
        .contiguous(at::MemoryFormat::ChannelsLast);
  }
  static at::Tensor Positive(int64_t n, double scale) {
    return (at::rand({n}, at::TensorOptions().device(at::kCUDA)) + 0.5) * scale;
  }
};

// y = conv(x, w) * weight_scale[k] * x_scale + bias[k] in float64, from the int8 values.
at::Tensor Reference(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                     const at::Tensor& weight_scale, const at::Tensor& bias, int64_t stride,
                     int64_t padding) {
  at::Tensor acc = at::conv2d(x.to(at::kDouble).contiguous(), weight.to(at::kDouble).contiguous(),
                              {}, stride, padding);
  acc = acc * (weight_scale.to(at::kDouble) * x_scale.to(at::kDouble)).view({1, -1, 1, 1});
  return bias.defined() ? acc + bias.to(at::kDouble).view({1, -1, 1, 1}) : acc;
}

TEST_F(Int8ConvGpuTest, EqualsTheFloat64ConvolutionWithinTheOutputsRounding) {
  const Shape shapes[] = {
      {2, 64, 16, 16, 32, 3, 1, 1, at::kHalf, true},       // a resnet convolution
      {3, 320, 8, 8, 640, 1, 1, 0, at::kHalf, true},       // a shortcut (1x1)
      {2, 32, 17, 15, 48, 3, 2, 1, at::kHalf, true},       // a downsampler, odd sides
      {1, 128, 12, 12, 64, 3, 1, 1, at::kBFloat16, true},  // bf16 out
      {2, 48, 10, 10, 16, 3, 1, 1, at::kHalf, false},      // no bias
  };
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "N" << s.n << " C" << s.c << " " << s.h << "x" << s.w << " K" << s.k << " r"
                 << s.kernel << " stride " << s.stride << " " << s.out << (s.bias ? " bias" : ""));
    const at::Tensor x = Int8({s.n, s.c, s.h, s.w}), w = Int8({s.k, s.c, s.kernel, s.kernel});
    const at::Tensor x_scale = Positive(1, 1e-2), w_scale = Positive(s.k, 1e-3);
    const at::Tensor bias = s.bias ? at::randn({s.k}, x_scale.options()) : at::Tensor();
    const at::Tensor y = Int8Conv2d(x, x_scale, w, w_scale, bias, s.stride, s.padding, s.out);
    const at::Tensor ref = Reference(x, x_scale, w, w_scale, bias, s.stride, s.padding);
    ASSERT_EQ(y.sizes(), ref.sizes());
    EXPECT_EQ(y.scalar_type(), s.out);
    EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
    // The float32 epilogue then one rounding to the output dtype: within one unit in its last
    // place (2^-10 of the value for fp16, 2^-7 for bf16), plus float32's rounding of sums.
    const double ulp = s.out == at::kHalf ? 1.0 / 1024 : 1.0 / 128;
    const at::Tensor err = (y.to(at::kDouble) - ref).abs();
    const at::Tensor bound = ref.abs() * ulp + ref.abs().max() * 1e-6;
    EXPECT_TRUE(at::all(err <= bound).item<bool>())
        << "largest error " << err.max().item<double>() << " of values up to "
        << ref.abs().max().item<double>();
    // The same call again runs the cached, tuned plan: the same bytes.
    EXPECT_TRUE(at::equal(Int8Conv2d(x, x_scale, w, w_scale, bias, s.stride, s.padding, s.out), y));
  }
}

TEST_F(Int8ConvGpuTest, PlansAreCachedPerShape) {
  const at::Tensor x = Int8({1, 16, 6, 6}), w = Int8({16, 16, 3, 3});
  const at::Tensor xs = Positive(1, 1e-2), ws = Positive(16, 1e-3);
  Int8Conv2d(x, xs, w, ws, at::Tensor(), 1, 1, at::kHalf);
  const int64_t plans = Int8ConvCachedPlans();
  Int8Conv2d(x, xs, w, ws, at::Tensor(), 1, 1, at::kHalf);
  EXPECT_EQ(Int8ConvCachedPlans(), plans);
  Int8Conv2d(Int8({2, 16, 6, 6}), xs, w, ws, at::Tensor(), 1, 1, at::kHalf);
  EXPECT_EQ(Int8ConvCachedPlans(), plans + 1);
}

TEST_F(Int8ConvGpuTest, BadArgumentsAreNamedErrors) {
  const at::Tensor x = Int8({1, 16, 6, 6}), w = Int8({16, 16, 3, 3});
  const at::Tensor xs = Positive(1, 1e-2), ws = Positive(16, 1e-3);
  const auto message = [&](auto&& call) {
    try {
      call();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              Int8Conv2d(x.to(at::kHalf), xs, w, ws, {}, 1, 1, at::kHalf);
            }).find("must be int8"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Int8Conv2d(x.contiguous(), xs, w, ws, {}, 1, 1, at::kHalf);
            }).find("channels-last"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Int8Conv2d(Int8({1, 24, 6, 6}), xs, Int8({16, 24, 3, 3}), ws, {}, 1, 1, at::kHalf);
            }).find("multiples of 16"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Int8Conv2d(x, Positive(2, 1), w, ws, {}, 1, 1, at::kHalf);
            }).find("x_scale must be float32 [1]"),
            std::string::npos);
  EXPECT_NE(
      message([&] { Int8Conv2d(x, xs, w, ws, {}, 1, 1, at::kFloat); }).find("float16 or bfloat16"),
      std::string::npos);
  EXPECT_NE(
      message([&] { Int8Conv2d(x.cpu(), xs, w, ws, {}, 1, 1, at::kHalf); }).find("CUDA device"),
      std::string::npos);
}

}  // namespace
}  // namespace qpool::quant::cuda
