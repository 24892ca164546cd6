// Quantization formats: round-trip error bounds, the NF4 table, packing order, odd shapes,
// double quantization and clear errors for bad input.
#include "quant/quant_format.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "quant/quantizer.h"

namespace qpool::quant {
namespace {

float LargestNf4Gap() {
  float gap = 0;
  for (size_t i = 1; i < kNf4Code.size(); ++i) gap = std::max(gap, kNf4Code[i] - kNf4Code[i - 1]);
  return gap;
}

// Heavy tails: Student-t with 2 degrees of freedom (normal / sqrt(chi2_2 / 2)).
at::Tensor HeavyTailed(int64_t rows, int64_t cols) {
  at::Tensor chi2 = at::randn({rows, cols}).pow(2) + at::randn({rows, cols}).pow(2);
  return at::randn({rows, cols}) / (chi2 / 2).sqrt().clamp_min(1e-3);
}

// Asserts |w - dequant| <= bound per nf4 block.
void ExpectNf4WithinBound(const at::Tensor& w, const QuantState& s, int64_t blocksize,
                          float extra_per_block = 0) {
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t kp = (k + blocksize - 1) / blocksize * blocksize;
  at::Tensor err = (Dequantize(s, k) - w).abs();
  at::Tensor err_padded = at::constant_pad_nd(err, {0, kp - k}, 0).reshape({-1, blocksize});
  at::Tensor w_absmax =
      at::constant_pad_nd(w.abs(), {0, kp - k}, 0).reshape({-1, blocksize}).amax(1);
  at::Tensor bound = w_absmax * (LargestNf4Gap() / 2) + 1e-6 + extra_per_block;
  EXPECT_TRUE((err_padded.amax(1) <= bound).all().item<bool>())
      << "worst excess " << (err_padded.amax(1) - bound).max().item<float>() << " for " << n << "x"
      << k;
}

TEST(QuantFormat, Nf4CodeIsTheStandardTable) {
  at::Tensor code = Nf4Code();
  ASSERT_EQ(code.numel(), 16);
  EXPECT_EQ(code.scalar_type(), at::kFloat);
  const float expected[16] = {-1.0f,
                              -0.6961928009986877f,
                              -0.5250730514526367f,
                              -0.39491748809814453f,
                              -0.28444138169288635f,
                              -0.18477343022823334f,
                              -0.09105003625154495f,
                              0.0f,
                              0.07958029955625534f,
                              0.16093020141124725f,
                              0.24611230194568634f,
                              0.33791524171829224f,
                              0.44070982933044434f,
                              0.5626170039176941f,
                              0.7229568362236023f,
                              1.0f};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(code[i].item<float>(), expected[i]) << "index " << i;
  EXPECT_TRUE((code.slice(0, 1) > code.slice(0, 0, 15)).all().item<bool>());
  at::Tensor nested = NestedCode();
  ASSERT_EQ(nested.numel(), 256);
  EXPECT_EQ(nested[128].item<float>(), 0.0f);
  EXPECT_EQ(nested[255].item<float>(), 1.0f);
  EXPECT_EQ(nested[1].item<float>(), -1.0f);
}

TEST(QuantFormat, Int8RoundTripWithinHalfStep) {
  torch::manual_seed(1);
  for (const at::Tensor& w : {at::randn({64, 320}), HeavyTailed(48, 200),
                              at::randn({3, 17}).to(at::kHalf).to(at::kFloat)}) {
    StatusOr<QuantState> s = QuantizeInt8(w);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->weight.scalar_type(), at::kChar);
    EXPECT_EQ(s->weight.sizes(), w.sizes());
    EXPECT_EQ(s->absmax.sizes(), at::IntArrayRef({w.size(0)}));
    EXPECT_TRUE(at::equal(s->absmax, w.abs().amax(1)));
    at::Tensor err = (Dequantize(*s, w.size(1)) - w).abs().amax(1);
    at::Tensor bound = s->absmax / 127 / 2 * (1 + 1e-5) + 1e-7;
    EXPECT_TRUE((err <= bound).all().item<bool>()) << (err - bound).max().item<float>();
    EXPECT_EQ(s->weight.abs().max().item<int>(), 127);  // the absmax element maps to +-127
  }
}

TEST(QuantFormat, Int8DequantizeIsQTimesScale) {
  torch::manual_seed(2);
  at::Tensor w = at::randn({5, 33});
  QuantState s = *QuantizeInt8(w);
  at::Tensor d = Dequantize(s, 33);
  auto q = s.weight.accessor<int8_t, 2>();
  auto a = s.absmax.accessor<float, 1>();
  auto dd = d.accessor<float, 2>();
  for (int n = 0; n < 5; ++n) {
    const float scale = a[n] / 127.0f;
    for (int k = 0; k < 33; ++k) ASSERT_EQ(dd[n][k], static_cast<float>(q[n][k]) * scale);
  }
}

TEST(QuantFormat, Nf4RoundTripWithinHalfLargestGap) {
  torch::manual_seed(3);
  for (int64_t bs : {16, 64, 256}) {
    for (const at::Tensor& w : {at::randn({32, 512}), HeavyTailed(16, 768)}) {
      StatusOr<QuantState> s = QuantizeNf4(w, bs, /*double_quant=*/false);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ(s->weight.scalar_type(), at::kByte);
      EXPECT_EQ(s->weight.sizes(), at::IntArrayRef({w.size(0), w.size(1) / 2}));
      EXPECT_EQ(s->absmax.numel(), w.numel() / bs);
      ExpectNf4WithinBound(w, *s, bs);
    }
  }
}

TEST(QuantFormat, Nf4PackingPutsEvenElementInHighNibble) {
  // A row whose values are exactly the code table (absmax 1) maps to indices 0..15.
  at::Tensor w = Nf4Code().reshape({1, 16}) * 2.0f;
  QuantState s = *QuantizeNf4(w, 16, false);
  ASSERT_EQ(s.weight.numel(), 8);
  const uint8_t expected[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(s.weight[0][j].item<uint8_t>(), expected[j]) << j;
  EXPECT_EQ(s.absmax[0].item<float>(), 2.0f);
  EXPECT_TRUE(at::equal(Dequantize(s, 16), w));
  // Reversed order gives swapped nibbles.
  QuantState r = *QuantizeNf4(w.flip(1), 16, false);
  EXPECT_EQ(r.weight[0][0].item<uint8_t>(), 0xFE);
}

TEST(QuantFormat, Nf4OddShapesArePaddedPerRow) {
  torch::manual_seed(4);
  struct Case {
    int64_t n, k, bs;
  };
  for (Case c :
       {Case{1, 16, 16}, Case{3, 17, 64}, Case{3, 1, 64}, Case{5, 100, 64}, Case{2, 65, 16}}) {
    at::Tensor w = at::randn({c.n, c.k});
    StatusOr<QuantState> s = QuantizeNf4(w, c.bs, true);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const int64_t kp = (c.k + c.bs - 1) / c.bs * c.bs;
    EXPECT_EQ(s->weight.sizes(), at::IntArrayRef({c.n, kp / 2})) << c.n << "x" << c.k;
    EXPECT_EQ(s->absmax.numel(), c.n * kp / c.bs);
    const QuantLayout layout = InspectQuantState(*s, c.k, "test");
    EXPECT_EQ(layout.blocksize, c.bs);
    EXPECT_EQ(layout.padded_in, kp);
    EXPECT_TRUE(layout.double_quant);
    at::Tensor d = Dequantize(*s, c.k);
    EXPECT_EQ(d.sizes(), w.sizes());
    const float nested_step = s->nested_absmax.max().item<float>() / 127 / 2;
    ExpectNf4WithinBound(w, *s, c.bs, nested_step * 1.01f);
  }
}

TEST(QuantFormat, DoubleQuantAbsmaxRoundTrip) {
  torch::manual_seed(5);
  at::Tensor w = HeavyTailed(40, 640);  // 400 blocks: two nested blocks, the second partial
  QuantState plain = *QuantizeNf4(w, 64, false);
  QuantState dq = *QuantizeNf4(w, 64, true);
  EXPECT_EQ(dq.absmax.scalar_type(), at::kByte);
  EXPECT_EQ(dq.absmax.numel(), 400);
  EXPECT_EQ(dq.nested_absmax.numel(), 2);
  EXPECT_EQ(dq.offset.numel(), 1);
  EXPECT_TRUE(at::equal(dq.weight, plain.weight));  // nibbles do not depend on double quant
  EXPECT_FLOAT_EQ(dq.offset.item<float>(), plain.absmax.mean().item<float>());
  at::Tensor restored = Nf4BlockAbsmax(dq);
  at::Tensor nested = dq.nested_absmax.repeat_interleave(256).slice(0, 0, 400);
  at::Tensor err = (restored - plain.absmax).abs();
  EXPECT_TRUE((err <= nested / 127 / 2 * 1.0001 + 1e-6).all().item<bool>());
  ExpectNf4WithinBound(w, dq, 64, dq.nested_absmax.max().item<float>() / 127 / 2 * 1.01f);
  EXPECT_LT(StateBytes(dq), StateBytes(plain));
}

TEST(QuantFormat, ZeroWeightsStayZero) {
  at::Tensor w = at::zeros({4, 64});
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kNf4}) {
    QuantState s = *Quantize(w, QuantOptions{f, 32, true});
    at::Tensor d = Dequantize(s, 64);
    EXPECT_TRUE(at::equal(d, w)) << QuantFormatName(f);
  }
}

TEST(QuantFormat, RowChunkingDoesNotChangeTheResult) {
  torch::manual_seed(6);
  at::Tensor w = at::randn({1100, 4096});  // 4.5 M elements: two chunks
  QuantState all = *QuantizeNf4(w, 64, false);
  QuantState top = *QuantizeNf4(w.slice(0, 0, 550), 64, false);
  QuantState bottom = *QuantizeNf4(w.slice(0, 550), 64, false);
  EXPECT_TRUE(at::equal(all.weight, at::cat({top.weight, bottom.weight})));
  EXPECT_TRUE(at::equal(all.absmax, at::cat({top.absmax, bottom.absmax})));
  QuantState i8 = *QuantizeInt8(w);
  EXPECT_TRUE(at::equal(i8.weight.slice(0, 550), QuantizeInt8(w.slice(0, 550))->weight));
}

TEST(QuantFormat, HalfAndBFloat16WeightsQuantizeLikeTheirFloatValues) {
  torch::manual_seed(7);
  at::Tensor w = at::randn({8, 128}).to(at::kBFloat16);
  QuantState a = *QuantizeNf4(w, 64, true);
  QuantState b = *QuantizeNf4(w.to(at::kFloat), 64, true);
  EXPECT_TRUE(at::equal(a.weight, b.weight));
  EXPECT_TRUE(at::equal(a.absmax, b.absmax));
  EXPECT_EQ(Dequantize(a, 128, at::kHalf).scalar_type(), at::kHalf);
}

TEST(QuantFormat, BadInputIsAClearError) {
  StatusOr<QuantFormat> f = ParseQuantFormat("fp8");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("'fp8'"), std::string::npos);
  EXPECT_TRUE(ParseQuantFormat("nf4").ok());

  for (int64_t bs : {0, 8, 48, 100, 8192, -64}) {
    Status st = ValidateBlocksize(bs);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bs;
    EXPECT_NE(st.message().find("power of two"), std::string::npos);
  }
  EXPECT_TRUE(ValidateBlocksize(16).ok());
  EXPECT_TRUE(ValidateBlocksize(4096).ok());

  StatusOr<QuantState> bad_bs = QuantizeNf4(at::randn({4, 64}), 48, false, "unet.proj_in");
  ASSERT_FALSE(bad_bs.ok());
  EXPECT_NE(bad_bs.status().message().find("unet.proj_in"), std::string::npos);

  StatusOr<QuantState> three_d = QuantizeInt8(at::randn({2, 3, 4}), "conv");
  ASSERT_FALSE(three_d.ok());
  EXPECT_EQ(three_d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(three_d.status().message().find("2-D"), std::string::npos);
  EXPECT_FALSE(QuantizeNf4(at::randn({8}), 64, false).ok());
  EXPECT_FALSE(QuantizeInt8(at::ones({4, 4}, at::kInt)).ok());
  EXPECT_FALSE(QuantizeInt8(at::empty({0, 4})).ok());
}

TEST(QuantFormat, InspectRejectsInconsistentState) {
  QuantState s = *QuantizeNf4(at::randn({4, 64}), 16, false);
  EXPECT_EQ(InspectQuantState(s, 64, "t").format, QuantFormat::kNf4);
  EXPECT_EQ(InspectQuantState(s, 49, "t").padded_in, 64);   // 49 rounds up to 64
  EXPECT_THROW(InspectQuantState(s, 48, "t"), c10::Error);  // would leave a whole padded block
  EXPECT_THROW(InspectQuantState(s, 65, "t"), c10::Error);
  QuantState bad_code = s;
  bad_code.code = at::zeros({8});
  try {
    InspectQuantState(bad_code, 64, "layer");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("code must be float32 [16]"), std::string::npos);
  }
  QuantState i8 = *QuantizeInt8(at::randn({4, 10}));
  i8.code = Nf4Code();
  EXPECT_THROW(InspectQuantState(i8, 10, "t"), c10::Error);  // int8 with a code table
  QuantState wrong_dtype = *QuantizeInt8(at::randn({4, 10}));
  wrong_dtype.weight = wrong_dtype.weight.to(at::kInt);
  EXPECT_THROW(InspectQuantState(wrong_dtype, 10, "t"), c10::Error);
}

}  // namespace
}  // namespace qpool::quant
