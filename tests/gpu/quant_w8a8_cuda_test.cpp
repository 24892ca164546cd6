// qpool::quant_linear for w8a8 layers on CUDA (Note [W8A8 linear]): the int8 product, through
// the warpgroup-MMA kernel on Hopper and through cuBLASLt, gives the CPU kernel's values bit for
// bit, and the fallback (fewer than 17 rows, K or N no multiple of 8) stays within the int8
// kernels' tolerance of the CPU.
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <initializer_list>
#include <string>

#include "quant/geglu_kernels.h"
#include "quant/geglu_linear_op.h"
#include "quant/geglu_op.h"
#include "quant/layer_norm_kernels.h"
#include "quant/layer_norm_op.h"
#include "quant/norm_linear_op.h"
#include "quant/quant_format.h"
#include "quant/quant_linear_cuda.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "quant/w8a8_kernels.h"
#include "quant/w8a8_linear.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

QuantState OnCuda(const QuantState& s) {
  const at::Device d(at::kCUDA, 0);
  return QuantState{s.weight.to(d),        s.absmax.to(d),      s.code.to(d),
                    s.nested_absmax.to(d), s.nested_code.to(d), s.offset.to(d)};
}

struct Shape {
  int64_t m, k, n;
};

std::string Name(const Shape& s, at::ScalarType dt) {
  return "M=" + std::to_string(s.m) + " K=" + std::to_string(s.k) + " N=" + std::to_string(s.n) +
         " " + c10::toString(dt);
}

TEST(W8A8Cuda, IntProductEqualsTheCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(41);
  for (Shape sh :
       {Shape{17, 64, 24}, Shape{77, 768, 320}, Shape{256, 1280, 5120}, Shape{4096, 320, 320}}) {
    const at::Tensor w = at::randn({sh.n, sh.k}) * 0.05;
    const at::Tensor bias = at::randn({sh.n});
    const at::Tensor smooth = at::rand({sh.k}) + 0.5;
    const QuantState s = *QuantizeW8A8(w, smooth);
    ASSERT_TRUE(W8A8IntMatmulRuns(sh.m, sh.k, sh.n));
    for (at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
      SCOPED_TRACE(Name(sh, dt));
      const at::Tensor x = at::randn({sh.m, sh.k}).to(dt);
      const at::Tensor cpu = QuantLinear(x, s, bias);
      const at::Tensor gpu = QuantLinear(x.cuda(), OnCuda(s), bias.cuda()).cpu();
      EXPECT_EQ(gpu.scalar_type(), dt);
      EXPECT_TRUE(at::equal(gpu, cpu))
          << (gpu.to(at::kFloat) - cpu.to(at::kFloat)).abs().max().item<float>();
      // Without a bias, and x with a leading batch dimension (its rows are quantized alike).
      const at::Tensor x3 = x.reshape({1, sh.m, sh.k});
      EXPECT_TRUE(at::equal(QuantLinear(x3.cuda(), OnCuda(s)).cpu(), QuantLinear(x3, s)));
    }
  }
}

// LaunchW8A8QuantizeRows's int8 rows, maxima and scales for 16-bit x [m, k] equal the CPU's (the
// ATen form of Note [W8A8 linear]).
void ExpectQuantizedRowsEqualTheCpu(const at::Tensor& x, const at::Tensor& smooth) {
  const int64_t m = x.size(0), k = x.size(1);
  const at::Tensor xs = x.to(at::kFloat).div(smooth);
  const at::Tensor amax = xs.abs().amax(1);
  const at::Tensor xc = x.cuda(), sc = smooth.cuda();
  const at::Tensor q = at::empty({m, k}, xc.options().dtype(at::kChar));
  const at::Tensor row_amax = at::empty({m}, xc.options().dtype(at::kFloat));
  const at::Tensor row_scale = at::empty({m}, xc.options().dtype(at::kFloat));
  cuda::LaunchW8A8QuantizeRows(xc.data_ptr(), ElemTypeOf(x.scalar_type()), sc.data_ptr<float>(), m,
                               k, q.data_ptr<int8_t>(), row_amax.data_ptr<float>(),
                               row_scale.data_ptr<float>(), at::cuda::getCurrentCUDAStream());
  const at::Tensor want = RowsToInt8(xs, amax);
  EXPECT_TRUE(at::equal(q.cpu(), want))
      << q.cpu().ne(want).sum().item<int64_t>() << " values differ";
  EXPECT_TRUE(at::equal(row_amax.cpu(), amax));
  EXPECT_TRUE(at::equal(row_scale.cpu(), DivideBy127(amax)));
}

// Note [Held rows]: every group size and chunk count, rows that fill a block partly, rows of
// zeros, and rows too wide to hold (one block a row); Note [Unit scales]: scales of ones, and
// scales of which most are 1, so that chunks of ones lie beside chunks with one scale that is not.
TEST(W8A8Cuda, QuantizedRowsEqualTheCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(45);
  for (int64_t k : {8, 64, 320, 520, 640, 1280, 2048, 2056, 5120, 8192, 10240, 10248}) {
    const at::Tensor scales = at::rand({k}) + 0.5;
    const at::Tensor mostly_ones = scales.masked_fill(at::rand({k}) < 0.9, 1.0);
    for (const at::Tensor& smooth : {scales, at::ones({k}), mostly_ones}) {
      for (int64_t m : {1, 33, 1000}) {
        for (at::ScalarType dt : {at::kHalf, at::kBFloat16}) {
          SCOPED_TRACE(Name(Shape{m, k, 0}, dt));
          at::Tensor x = at::randn({m, k}).to(dt);
          x[m / 2].zero_();
          ExpectQuantizedRowsEqualTheCpu(x, smooth);
        }
      }
    }
  }
}

// Note [Division by the row's reciprocal]: values of every binade and SmoothQuant's whole range
// of scales, so that many quotients fall on or near the points where rounding changes; in
// bfloat16 also rows whose maxima lie below and above the range divided by the reciprocal.
TEST(W8A8Cuda, QuantizedRowsOfEveryMagnitudeEqualTheCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(46);
  for (int64_t k : {640, 1280, 5120, 10248}) {
    const int64_t m = 512;
    const at::Tensor smooth = at::pow(10.0, at::rand({k}) * 10 - 5);  // [1e-5, 1e5]
    const at::Tensor binades = at::randint(-14, 12, {m, k}).to(at::kFloat);
    const at::Tensor x = at::randn({m, k}) * at::exp2(binades);
    SCOPED_TRACE(Name(Shape{m, k, 0}, at::kHalf));
    ExpectQuantizedRowsEqualTheCpu(x.to(at::kHalf), smooth);
    // Rows scaled by 2^-110 to 2^90: maxima of x / smooth below 2^-60 and above 2^100, none
    // infinite (where a row's maximum overflows, the CPU's int8 of NaN is not defined).
    const at::Tensor rows = at::exp2(at::linspace(-110, 90, m)).unsqueeze(1);
    SCOPED_TRACE(Name(Shape{m, k, 0}, at::kBFloat16));
    ExpectQuantizedRowsEqualTheCpu((x * rows).to(at::kBFloat16), smooth);
  }
}

// Note [GEGLU rows]: the GEGLU rows quantized in one pass are the bytes of qpool::geglu's kernel
// followed by the quantizing pass, for every group size, rows that fill a block partly, and x
// whose rows lie further apart than their 2d values (a view into a wider buffer).
TEST(W8A8Cuda, GegluRowsEqualGegluThenQuantize) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(47);
  for (int64_t d : {8, 320, 640, 1280, 2048, 5120, 10240}) {
    for (int64_t m : {1, 33, 1000}) {
      const at::Tensor smooth = at::pow(10.0, at::rand({d}) * 4 - 2).cuda();
      for (at::ScalarType dt : {at::kHalf, at::kBFloat16}) {
        for (int64_t pad : {0, 8}) {
          SCOPED_TRACE(Name(Shape{m, d, 0}, dt) + " pad " + std::to_string(pad));
          const at::Tensor wide = (at::randn({m, 2 * d + pad}) * 3).to(dt).cuda();
          const at::Tensor x = wide.narrow(1, 0, 2 * d);
          const cuda::ElemType type = ElemTypeOf(dt);
          const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
          const auto i8 = x.options().dtype(at::kChar), f32 = x.options().dtype(at::kFloat);
          const at::Tensor h = at::empty({m, d}, x.options());
          cuda::LaunchGeglu(x.data_ptr(), x.stride(0), m, d, h.data_ptr(), type, stream);
          const at::Tensor q = at::empty({m, d}, i8), amax = at::empty({m}, f32),
                           scale = at::empty({m}, f32);
          cuda::LaunchW8A8QuantizeRows(h.data_ptr(), type, smooth.data_ptr<float>(), m, d,
                                       q.data_ptr<int8_t>(), amax.data_ptr<float>(),
                                       scale.data_ptr<float>(), stream);
          const at::Tensor fq = at::empty({m, d}, i8), famax = at::empty({m}, f32),
                           fscale = at::empty({m}, f32);
          ASSERT_TRUE(cuda::W8A8GegluRowsSupported(x.data_ptr(), x.stride(0), d, type,
                                                   smooth.data_ptr<float>()));
          cuda::LaunchW8A8GegluQuantizeRows(
              x.data_ptr(), x.stride(0), type, smooth.data_ptr<float>(), m, d,
              fq.data_ptr<int8_t>(), famax.data_ptr<float>(), fscale.data_ptr<float>(), stream);
          EXPECT_TRUE(at::equal(fq, q)) << fq.ne(q).sum().item<int64_t>() << " values differ";
          EXPECT_TRUE(at::equal(famax, amax));
          EXPECT_TRUE(at::equal(fscale, scale));
        }
      }
    }
  }
  // Rows it does not take: float32, a width or stride no multiple of 8, rows that overlap (a
  // stride below 2d), rows wider than held.
  const at::Tensor s8 = at::ones({16}, at::kCUDA);
  const float* sp = s8.data_ptr<float>();
  EXPECT_FALSE(cuda::W8A8GegluRowsSupported(s8.data_ptr(), 16, 8, cuda::ElemType::kFloat, sp));
  EXPECT_FALSE(cuda::W8A8GegluRowsSupported(s8.data_ptr(), 12, 6, cuda::ElemType::kHalf, sp));
  EXPECT_FALSE(cuda::W8A8GegluRowsSupported(s8.data_ptr(), 20, 8, cuda::ElemType::kHalf, sp));
  EXPECT_FALSE(cuda::W8A8GegluRowsSupported(s8.data_ptr(), 8, 8, cuda::ElemType::kHalf, sp));
  EXPECT_FALSE(
      cuda::W8A8GegluRowsSupported(s8.data_ptr(), 20496, 10248, cuda::ElemType::kHalf, sp));
}

// Calls check(shape, layer, bias, dtype) for a w8a8 layer of each shape (on the GPU), its
// activation scales random and all ones, in fp16, bf16 and float32, under a trace naming them.
template <typename F>
void ForEachW8A8Layer(std::initializer_list<Shape> shapes, F&& check) {
  for (Shape sh : shapes) {
    const at::Tensor w = at::randn({sh.n, sh.k}) * 0.05;
    const at::Tensor bias = at::randn({sh.n}).cuda();
    for (bool ones : {false, true}) {
      const QuantState sc =
          OnCuda(*QuantizeW8A8(w, ones ? at::ones({sh.k}) : at::rand({sh.k}) + 0.5));
      for (at::ScalarType dt : {at::kHalf, at::kBFloat16, at::kFloat}) {
        SCOPED_TRACE(Name(sh, dt) + (ones ? " ones" : " random scales"));
        check(sh, sc, bias, dt);
      }
    }
  }
}

// Note [GEGLU linear op]: qpool::geglu_quant_linear on CUDA gives qpool::geglu then
// qpool::quant_linear on CUDA, byte for byte: through the fused rows on 16-bit x where the int8
// product runs (the warpgroup-MMA kernel at 2048 rows and on SDXL's two feed-forward widths at
// four images, cuBLASLt at 100), and the two ops for float32 x and below 17 rows; with random
// activation scales and with ones.
TEST(W8A8Cuda, GegluLinearEqualsGegluThenTheLinear) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(45);
  ForEachW8A8Layer(
      {Shape{2048, 1280, 640}, Shape{100, 320, 256}, Shape{8, 64, 32}, Shape{8192, 5120, 1280},
       Shape{32768, 2560, 640}},
      [](Shape sh, const QuantState& sc, const at::Tensor& bias, at::ScalarType dt) {
        // [2, m / 2, 2k] where m is even: the op takes any leading dimensions.
        const at::Tensor x = (at::randn({sh.m, 2 * sh.k}) * 2).to(dt).cuda();
        const at::Tensor xv = sh.m % 2 == 0 ? x.view({2, sh.m / 2, 2 * sh.k}) : x;
        if (dt != at::kFloat && sh.m >= kW8A8MinRows) {  // meant for the fused rows
          ASSERT_TRUE(W8A8IntMatmulRuns(sh.m, sh.k, sh.n));
          ASSERT_TRUE(cuda::W8A8GegluRowsSupported(x.data_ptr(), 2 * sh.k, sh.k, ElemTypeOf(dt),
                                                   sc.code.data_ptr<float>()));
        }
        const at::Tensor got = GegluQuantLinear(xv, sc, bias).cpu();
        const at::Tensor want = QuantLinear(Geglu(xv), sc, bias).cpu();
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_TRUE(at::equal(got, want))
            << got.ne(want).sum().item<int64_t>() << " values differ, max "
            << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
      });
}

// Note [Norm linear op]: qpool::layer_norm_quant_linear and add_layer_norm_quant_linear on CUDA
// give qpool::layer_norm / add_layer_norm then qpool::quant_linear on CUDA, byte for byte:
// through the quantized norm rows (Note [Quantized norm rows]) on 16-bit x where the int8 product
// runs (SDXL's three norm-fed projections at four images, SD 1.5's feed-forward at one, and
// cuBLASLt at 100 rows), and the two ops for float32 x, rows wider than a warp holds and below 17
// rows; with random activation scales and with ones.
TEST(W8A8Cuda, NormLinearEqualsTheNormThenTheLinear) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(47);
  const double eps = 1e-5;
  ForEachW8A8Layer(
      {Shape{32768, 640, 1920}, Shape{8192, 1280, 1280}, Shape{8192, 1280, 10240},
       Shape{4096, 320, 2560}, Shape{100, 320, 256}, Shape{64, 2560, 64}, Shape{8, 64, 32}},
      [eps](Shape sh, const QuantState& sc, const at::Tensor& bias, at::ScalarType dt) {
        const at::Tensor gamma = (at::rand({sh.k}) + 0.5).to(dt).cuda();
        const at::Tensor beta = at::randn({sh.k}).to(dt).cuda();
        // [2, m / 2, k]: the ops take any leading dimensions.
        const at::Tensor x = (at::randn({2, sh.m / 2, sh.k}) * 3 + 1).to(dt).cuda();
        const at::Tensor r = at::randn({2, sh.m / 2, sh.k}).to(dt).cuda();
        if (dt != at::kFloat && sh.m >= kW8A8MinRows && sh.k <= 2048) {  // meant for the rows
          ASSERT_TRUE(W8A8IntMatmulRuns(sh.m, sh.k, sh.n));
          cuda::LayerNormArgs args;
          args.x = x.data_ptr();
          args.residual = r.data_ptr();
          args.weight = gamma.data_ptr();
          args.bias = beta.data_ptr();
          args.smooth = sc.code.data_ptr<float>();
          args.d = sh.k;
          args.type = ElemTypeOf(dt);
          ASSERT_TRUE(cuda::LayerNormQuantizeSupported(args));
        }
        const at::Tensor got = LayerNormQuantLinear(x, gamma, beta, eps, sc, bias).cpu();
        const at::Tensor want = QuantLinear(LayerNorm(x, gamma, beta, eps), sc, bias).cpu();
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_TRUE(at::equal(got, want)) << got.ne(want).sum().item<int64_t>() << " differ";
        const auto [sum, out] = AddLayerNormQuantLinear(x, r, gamma, beta, eps, sc, bias);
        const auto [want_sum, normed] = AddLayerNorm(x, r, gamma, beta, eps);
        EXPECT_TRUE(at::equal(sum, want_sum));
        const at::Tensor want_out = QuantLinear(normed, sc, bias);
        EXPECT_TRUE(at::equal(out, want_out))
            << out.ne(want_out).sum().item<int64_t>() << " differ";
      });
}

bool Hopper() { return at::cuda::getCurrentDeviceProperties()->major == 9; }

// Note [Warpgroup-MMA W8A8 linear]: the kernel's bytes are the CPU's and cuBLASLt's, on shapes
// whose K, M or N are no multiples of its k-block and tiles, on every tile size, and on ones
// whose stream-K schedule splits tiles between blocks.
TEST(W8A8Cuda, WarpgroupKernelEqualsTheCpuAndCublas) {
  SKIP_WITHOUT_CUDA();
  if (!Hopper()) GTEST_SKIP() << "the warpgroup-MMA kernel needs compute capability 9.0";
  torch::manual_seed(43);
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const Shape split{256, 5120, 1280};
  EXPECT_GT(cuda::W8A8WgmmaWorkspaceBytes(split.m, split.k, split.n, sm_count), 0)
      << "the stream-K case no longer splits a tile";
  for (Shape sh : {Shape{17, 64, 24}, Shape{77, 768, 320}, Shape{100, 320, 2560}, split,
                   Shape{1030, 1280, 136}, Shape{4096, 320, 320}, Shape{333, 2048, 1280}}) {
    const at::Tensor w = at::randn({sh.n, sh.k}) * 0.05;
    const at::Tensor bias = at::randn({sh.n});
    const QuantState s = *QuantizeW8A8(w, at::rand({sh.k}) + 0.5);
    const QuantState sc = OnCuda(s);
    for (at::ScalarType dt : {at::kHalf, at::kBFloat16}) {
      SCOPED_TRACE(Name(sh, dt));
      const at::Tensor x = at::randn({sh.m, sh.k}).to(dt);
      const at::Tensor xc = x.cuda();
      const at::Tensor q = at::empty({sh.m, sh.k}, xc.options().dtype(at::kChar));
      ASSERT_TRUE(cuda::W8A8WgmmaSupported(sh.m, sh.k, sh.n, q.data_ptr(), sc.weight.data_ptr(),
                                           ElemTypeOf(dt)));
      // No bias, a float32 one, and one of x's dtype (which the kernel widens itself).
      for (int bias_case : {0, 1, 2}) {
        const at::Tensor bias_cpu = bias_case == 2 ? bias.to(dt) : bias;
        const std::optional<at::Tensor> b =
            bias_case > 0 ? std::optional<at::Tensor>(bias_cpu.cuda()) : std::nullopt;
        const at::Tensor cpu =
            QuantLinear(x, s, bias_case > 0 ? std::optional(bias_cpu) : std::nullopt);
        const at::Tensor wgmma = QuantLinearCuda(xc, sc, b, CudaPath::kWgmma).cpu();
        const at::Tensor cublas = QuantLinearCuda(xc, sc, b, CudaPath::kIntMatmul).cpu();
        EXPECT_TRUE(at::equal(cublas, cpu));
        EXPECT_TRUE(at::equal(wgmma, cpu))
            << (wgmma.to(at::kFloat) - cpu.to(at::kFloat)).abs().max().item<float>();
      }
    }
  }
}

// Note [Ping-pong W8A8 tiles]: both tile kinds, forced, give the CPU's bytes; the shapes give
// blocks one tile (the second warpgroup idle), two, and several per warpgroup, with one k-block
// (the ring wrapping within a tile pair) and K, M and N no multiples of the tiles.
TEST(W8A8Cuda, BothTileKindsEqualTheCpu) {
  SKIP_WITHOUT_CUDA();
  if (!Hopper()) GTEST_SKIP() << "the warpgroup-MMA kernel needs compute capability 9.0";
  torch::manual_seed(44);
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  for (Shape sh : {Shape{200, 320, 264}, Shape{8192, 64, 1280}, Shape{3000, 1280, 1288},
                   Shape{9000, 144, 2560}, Shape{1100, 5120, 640}}) {
    const at::Tensor w = at::randn({sh.n, sh.k}) * 0.05;
    const at::Tensor bias = at::randn({sh.n});
    const QuantState s = *QuantizeW8A8(w, at::rand({sh.k}) + 0.5);
    const QuantState sc = OnCuda(s);
    for (at::ScalarType dt : {at::kHalf, at::kBFloat16}) {
      SCOPED_TRACE(Name(sh, dt));
      const at::Tensor x = at::randn({sh.m, sh.k}).to(dt);
      const at::Tensor cpu = QuantLinear(x, s, bias);
      const at::Tensor xc = x.cuda();
      const at::TensorOptions f32 = xc.options().dtype(at::kFloat);
      const at::Tensor q = at::empty({sh.m, sh.k}, xc.options().dtype(at::kChar));
      const at::Tensor amax = at::empty({sh.m}, f32), scale = at::empty({sh.m}, f32);
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
      cuda::LaunchW8A8QuantizeRows(xc.data_ptr(), ElemTypeOf(dt), sc.code.data_ptr<float>(), sh.m,
                                   sh.k, q.data_ptr<int8_t>(), amax.data_ptr<float>(),
                                   scale.data_ptr<float>(), stream);
      const at::Tensor b = bias.cuda();
      for (cuda::W8A8Tiles tiles : {cuda::W8A8Tiles::kShared, cuda::W8A8Tiles::kPingPong}) {
        SCOPED_TRACE(tiles == cuda::W8A8Tiles::kShared ? "shared" : "ping-pong");
        const int64_t bytes = cuda::W8A8WgmmaWorkspaceBytes(sh.m, sh.k, sh.n, sm_count, tiles);
        if (tiles == cuda::W8A8Tiles::kPingPong) EXPECT_EQ(bytes, 0);
        const at::Tensor workspace =
            at::empty({std::max<int64_t>(bytes, 16)}, f32.dtype(at::kByte));
        const at::Tensor out = at::full({sh.m, sh.n}, 7.0, xc.options());
        cuda::LaunchW8A8Wgmma(
            q.data_ptr<int8_t>(), scale.data_ptr<float>(), sc.weight.data_ptr<int8_t>(),
            sc.absmax.data_ptr<float>(), b.data_ptr(), cuda::ElemType::kFloat, sh.m, sh.k, sh.n,
            out.data_ptr(), ElemTypeOf(dt), sm_count, workspace.data_ptr(), stream, tiles);
        const at::Tensor got = out.cpu();
        EXPECT_TRUE(at::equal(got, cpu))
            << got.ne(cpu).sum().item<int64_t>() << " values differ, max "
            << (got.to(at::kFloat) - cpu.to(at::kFloat)).abs().max().item<float>();
      }
    }
  }
}

TEST(W8A8Cuda, FallbackStaysCloseToTheCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(42);
  for (Shape sh : {Shape{1, 320, 1280}, Shape{16, 768, 320}, Shape{77, 36, 64}}) {
    const at::Tensor w = at::randn({sh.n, sh.k}) * 0.05;
    const QuantState s = *QuantizeW8A8(w);
    ASSERT_FALSE(W8A8IntMatmulRuns(sh.m, sh.k, sh.n));
    for (at::ScalarType dt : {at::kFloat, at::kHalf}) {
      SCOPED_TRACE(Name(sh, dt));
      const at::Tensor x = at::randn({sh.m, sh.k}).to(dt);
      const at::Tensor cpu = QuantLinear(x, s).to(at::kFloat);
      const at::Tensor gpu = QuantLinear(x.cuda(), OnCuda(s)).cpu().to(at::kFloat);
      const double scale = cpu.abs().max().item<double>();
      EXPECT_LT((gpu - cpu).abs().max().item<double>(), (dt == at::kFloat ? 1e-4 : 1e-2) * scale);
    }
  }
}

TEST(W8A8Cuda, DequantizeUndoesTheSmoothing) {
  SKIP_WITHOUT_CUDA();
  const at::Tensor w = at::randn({40, 64});
  const QuantState s = *QuantizeW8A8(w, at::rand({64}) + 0.5);
  EXPECT_TRUE(at::equal(DequantizeCuda(OnCuda(s), 64, at::kFloat).cpu(), Dequantize(s, 64)));
}

}  // namespace
}  // namespace qpool::quant
