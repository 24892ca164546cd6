// qpool::quant_linear on CUDA: every algorithm against the CPU reference for int8 / nf4 /
// nf4 + double quant in fp16, bf16 and fp32, odd shapes, unaligned inputs, and device errors.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>

#include "quant/quant_format.h"
#include "quant/quant_linear_cuda.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "testing/c10_error.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

struct FormatCase {
  const char* name;
  QuantFormat format;
  int64_t blocksize;
  bool double_quant;
};

const FormatCase kFormats[] = {
    {"int8", QuantFormat::kInt8, 64, false},
    {"nf4", QuantFormat::kNf4, 64, false},
    {"nf4_dq", QuantFormat::kNf4, 64, true},
    {"nf4_bs16_dq", QuantFormat::kNf4, 16, true},
};

QuantState ToDevice(const QuantState& s, const at::Device& d) {
  return QuantState{s.weight.to(d),        s.absmax.to(d),      s.code.to(d),
                    s.nested_absmax.to(d), s.nested_code.to(d), s.offset.to(d)};
}

using testing::ErrorOf;

// "nf4 320x768 M=77 Half": a case in failure messages.
std::string CaseName(const FormatCase& f, int64_t n, int64_t k, int64_t m, at::ScalarType dt) {
  return std::string(f.name) + " " + std::to_string(n) + "x" + std::to_string(k) +
         " M=" + std::to_string(m) + " " + c10::toString(dt);
}

// Compares a CUDA result with the float32 CPU reference, relative to the output's scale.
void ExpectClose(const at::Tensor& cuda, const at::Tensor& ref, at::ScalarType dtype,
                 const std::string& what) {
  ASSERT_EQ(cuda.scalar_type(), dtype) << what;
  ASSERT_EQ(cuda.sizes(), ref.sizes()) << what;
  const at::Tensor got = cuda.cpu().to(at::kFloat);
  const float scale = ref.abs().max().item<float>() + 1e-6f;
  const float tol = dtype == at::kFloat ? 1e-4f : (dtype == at::kHalf ? 4e-3f : 2e-2f);
  const float worst = (got - ref).abs().max().item<float>() / scale;
  EXPECT_LE(worst, tol) << what;
}

// The CUDA op on `path` against the CPU op on the same inputs, with and without the bias; `ref`
// is the CPU result with the bias.
void ExpectPathMatchesCpu(const at::Tensor& x, const QuantState& s, const QuantState& g,
                          const at::Tensor& bias, const at::Tensor& ref, CudaPath path,
                          at::ScalarType dt, const std::string& what) {
  ExpectClose(QuantLinearCuda(x.cuda(), g, bias.cuda(), path), ref, dt, what);
  ExpectClose(QuantLinearCuda(x.cuda(), g, std::nullopt, path), QuantLinear(x.to(at::kFloat), s),
              dt, what + " no bias");
}

// One layer of a CUDA-against-CPU test: its state on the CPU, the state's copy on the GPU and
// the CPU bias.
struct QuantizedLayer {
  const FormatCase& f;
  int64_t n, k;
  const QuantState& s;
  const QuantState& g;
  const at::Tensor& bias;
};

// For each [n, k] of `shapes`, a random weight (x 0.05) and bias, quantized in every format of
// kFormats; `body` gets each layer.
void ForEachQuantizedLayer(std::initializer_list<std::pair<int64_t, int64_t>> shapes,
                           const std::function<void(const QuantizedLayer&)>& body) {
  for (auto [n, k] : shapes) {
    const at::Tensor w = at::randn({n, k}) * 0.05;
    const at::Tensor bias = at::randn({n});
    for (const FormatCase& f : kFormats) {
      const QuantState s = *Quantize(w, QuantOptions{f.format, f.blocksize, f.double_quant});
      const QuantState g = ToDevice(s, at::kCUDA);
      body(QuantizedLayer{f, n, k, s, g, bias});
    }
  }
}

// An input of a layer: x on the CPU, the float32 CPU result with the bias, x's dtype and the
// case's name.
struct LayerInput {
  at::Tensor x, ref;
  at::ScalarType dt;
  std::string what;
};

// For each M of `ms` and each dtype, a random x [M, k] given to `body`.
void ForEachInput(const QuantizedLayer& layer, const std::vector<int64_t>& ms,
                  std::initializer_list<at::ScalarType> dtypes,
                  const std::function<void(const LayerInput&)>& body) {
  for (int64_t m : ms) {
    for (at::ScalarType dt : dtypes) {
      const at::Tensor x = at::randn({m, layer.k}).to(dt);
      body(LayerInput{x, QuantLinear(x.to(at::kFloat), layer.s, layer.bias), dt,
                      CaseName(layer.f, layer.n, layer.k, m, dt)});
    }
  }
}

TEST(QuantCuda, DequantizeIsBitIdenticalToCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(21);
  for (const FormatCase& f : kFormats) {
    for (int64_t k : {256, 100, 17}) {
      at::Tensor w = at::randn({37, k});
      QuantState s = *Quantize(w, QuantOptions{f.format, f.blocksize, f.double_quant});
      QuantState g = ToDevice(s, at::kCUDA);
      const at::Tensor cpu = Dequantize(s, k);
      EXPECT_TRUE(at::equal(DequantizeCuda(g, k, at::kFloat).cpu(), cpu)) << f.name << " K=" << k;
      EXPECT_TRUE(at::equal(DequantizeCuda(g, k, at::kHalf).cpu(), cpu.to(at::kHalf)))
          << f.name << " K=" << k;
      EXPECT_TRUE(at::equal(DequantizeCuda(g, k, at::kBFloat16).cpu(), cpu.to(at::kBFloat16)))
          << f.name << " K=" << k;
    }
  }
}

TEST(QuantCuda, BothPathsMatchCpuForAllFormatsDtypesAndM) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(22);
  ForEachQuantizedLayer({{320, 768}, {257, 100}, {33, 1040}}, [](const QuantizedLayer& l) {
    const auto dtypes = {at::kHalf, at::kBFloat16, at::kFloat};
    ForEachInput(l, {1, 7, 16, 77, 300, 1024}, dtypes, [&](const LayerInput& in) {
      const at::Tensor xg = in.x.cuda(), bg = l.bias.cuda();
      ExpectClose(QuantLinear(xg, l.g, bg), in.ref, in.dt, in.what + " auto");
      ExpectClose(QuantLinearCuda(xg, l.g, bg, CudaPath::kFused), in.ref, in.dt,
                  in.what + " fused");
      ExpectClose(QuantLinearCuda(xg, l.g, bg, CudaPath::kMma), in.ref, in.dt, in.what + " mma");
      ExpectClose(QuantLinearCuda(xg, l.g, std::nullopt, CudaPath::kDequantMatmul),
                  QuantLinear(in.x.to(at::kFloat), l.s), in.dt, in.what + " dequant+matmul");
    });
  });
}

// The fast dequantize kernel (Note [Fast dequantize]) on large layouts, including a weight
// whose unit count is no multiple of the grid, stays bit-identical to the CPU.
TEST(QuantCuda, FastDequantizeIsBitIdenticalOnLargeShapes) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(24);
  for (const FormatCase& f : kFormats) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1000, 1280}, {3, 4096}, {517, 64}}) {
      at::Tensor w = at::randn({n, k}) * 0.03;
      QuantState s = *Quantize(w, QuantOptions{f.format, f.blocksize, f.double_quant});
      QuantState g = ToDevice(s, at::kCUDA);
      const at::Tensor cpu = Dequantize(s, k);
      const std::string what = std::string(f.name) + " " + std::to_string(n) + "x" +
                               std::to_string(k);
      EXPECT_TRUE(at::equal(DequantizeCuda(g, k, at::kFloat).cpu(), cpu)) << what;
      EXPECT_TRUE(at::equal(DequantizeCuda(g, k, at::kHalf).cpu(), cpu.to(at::kHalf))) << what;
      EXPECT_TRUE(at::equal(DequantizeCuda(g, k, at::kBFloat16).cpu(), cpu.to(at::kBFloat16)))
          << what;
    }
  }
}

// The tensor-core kernels for every M in 1..16 (both row buckets) and medium M around the row
// groups of 32 and 80 (Note [Tensor-core medium-M linear]: one and several groups, partial
// groups), output features that are no multiple of 8 or of a block, and layers long enough to be
// split along k (Note [Split-k over a cluster]), against the CPU reference; auto must agree.
TEST(QuantCuda, MmaPathMatchesCpuForSmallAndMediumMAndSplit) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(25);
  std::vector<int64_t> ms;
  for (int64_t m = 1; m <= 16; ++m) ms.push_back(m);
  for (int64_t m : {17, 32, 33, 64, 77, 80, 81, 154, 160, 161}) ms.push_back(m);
  ForEachQuantizedLayer({{70, 1536}, {9, 8192}, {600, 320}}, [&](const QuantizedLayer& l) {
    ForEachInput(l, ms, {at::kHalf, at::kBFloat16}, [&](const LayerInput& in) {
      ExpectPathMatchesCpu(in.x, l.s, l.g, l.bias, in.ref, CudaPath::kMma, in.dt, in.what + " mma");
      ExpectClose(QuantLinear(in.x.cuda(), l.g, l.bias.cuda()), in.ref, in.dt, in.what + " auto");
    });
  });
}

// Every block shape of the small-M kernel, forced (Note [Small-M block shape]), against the CPU
// reference: 2 and 4 tiles per warp, 1, 3 and 8 splits of k (split ranges that end inside a row
// and splits left without a step), M on both sides of 8.
TEST(QuantCuda, SmallMBlockShapesMatchCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(27);
  ForEachQuantizedLayer({{70, 1536}, {33, 320}, {300, 3072}}, [](const QuantizedLayer& l) {
    ForEachInput(l, {1, 3, 8, 9, 16}, {at::kHalf, at::kBFloat16}, [&](const LayerInput& in) {
      for (int tiles : {2, 4}) {
        for (int splits : {1, 3, 8}) {
          const std::string what =
              in.what + " tiles " + std::to_string(tiles) + " splits " + std::to_string(splits);
          ExpectClose(QuantLinearCuda(in.x.cuda(), l.g, l.bias.cuda(), CudaPath::kMma,
                                      cuda::MmaShape{tiles, splits}),
                      in.ref, in.dt, what);
        }
      }
    });
  });
}

// The automatic block shape on the benchmark layers (Note [Small-M block shape]): k is split only
// while the blocks fit in one wave of resident blocks and each split keeps 32 or more 64-byte
// steps; on a 132-multiprocessor Hopper GPU (H100, H200) the shapes the measurements chose.
TEST(QuantCuda, SmallMBlockShapeFollowsTheRule) {
  SKIP_WITHOUT_CUDA();
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  const bool hopper132 = props->major == 9 && props->multiProcessorCount == 132;
  struct Case {
    int64_t k, n;
    QuantFormat format;
    int64_t m;
    int tiles, splits;  // expected on hopper132
  };
  const Case cases[] = {
      {3072, 3072, QuantFormat::kNf4, 1, 2, 1},   {3072, 3072, QuantFormat::kNf4, 16, 4, 1},
      {1280, 10240, QuantFormat::kNf4, 1, 4, 1},  {1280, 10240, QuantFormat::kInt8, 16, 2, 1},
      {1280, 10240, QuantFormat::kInt8, 1, 4, 1}, {2048, 1280, QuantFormat::kNf4, 4, 2, 1},
      {12288, 3072, QuantFormat::kNf4, 16, 4, 2}, {12288, 3072, QuantFormat::kInt8, 1, 2, 2},
      {320, 320, QuantFormat::kNf4, 16, 2, 1},    {3072, 12288, QuantFormat::kNf4, 8, 4, 1},
  };
  for (const Case& c : cases) {
    const QuantState g =
        *Quantize(at::randn({c.n, c.k}, at::kCUDA), QuantOptions{c.format, 64, false});
    const at::Tensor x = at::zeros({c.m, c.k}, at::TensorOptions(at::kCUDA).dtype(at::kHalf));
    const cuda::MmaPlan plan = MmaPlanFor(x, g);
    const std::string what = std::to_string(c.k) + "x" + std::to_string(c.n) +
                             (c.format == QuantFormat::kInt8 ? " int8" : " nf4") +
                             " M=" + std::to_string(c.m);
    const int64_t row_bytes = c.format == QuantFormat::kInt8 ? c.k : c.k / 2;
    EXPECT_EQ(plan.blocks, (c.n + 8 * plan.tiles - 1) / (8 * plan.tiles)) << what;
    if (plan.splits > 1) {
      EXPECT_LE(plan.blocks * plan.splits, int64_t{plan.blocks_per_sm} * props->multiProcessorCount)
          << what;
      EXPECT_GE((row_bytes + 63) / 64 / plan.splits, 32) << what;
    }
    if (hopper132) {
      EXPECT_EQ(plan.tiles, c.tiles) << what;
      EXPECT_EQ(plan.splits, c.splits) << what;
    }
  }
}

// The automatic choice for M > 16 (Note [Medium-M path choice]) on the benchmark layers.
TEST(QuantCuda, MediumMPathRuleFollowsTheMeasurements) {
  EXPECT_TRUE(MediumMmaWins(17, 3072, 12288));
  EXPECT_TRUE(MediumMmaWins(32, 12288, 3072));
  EXPECT_TRUE(MediumMmaWins(77, 12288, 3072));
  EXPECT_FALSE(MediumMmaWins(77, 3072, 12288));
  EXPECT_FALSE(MediumMmaWins(48, 12288, 3072));
  EXPECT_FALSE(MediumMmaWins(154, 12288, 3072));
  EXPECT_FALSE(MediumMmaWins(32, 1280, 10240));
  EXPECT_FALSE(MediumMmaWins(32, 3072, 3072));
  EXPECT_FALSE(MediumMmaWins(16, 12288, 3072));
}

// The warpgroup-MMA kernel (Note [Warpgroup-MMA large-M linear]) against the CPU reference: every
// format it takes, fp16 and bf16, both row tiles, M from one row to several tiles with partial
// ones, output features that fill no tile, and more tiles than multiprocessors (a persistent
// block walks several). It must run on a Hopper GPU (no silent fallback) and
// be refused elsewhere and for layouts it does not take (blocks of 16, float32 x).
TEST(QuantCuda, WgmmaPathMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(26);
  const bool hopper = at::cuda::getCurrentDeviceProperties()->major == 9;
  // 320 x 320 takes 64-row tiles (int8, nf4) by the rule, which the forced path follows.
  const auto shapes = {
      std::pair<int64_t, int64_t>{320, 768}, {8, 1280}, {264, 2048}, {1280, 256}, {320, 320}};
  ForEachQuantizedLayer(shapes, [&](const QuantizedLayer& l) {
    const bool takes = l.f.blocksize >= 64;
    EXPECT_EQ(WgmmaRuns(at::zeros({4, l.k}, at::kHalf).cuda(), l.g), hopper && takes) << l.f.name;
    EXPECT_FALSE(WgmmaRuns(at::zeros({4, l.k}).cuda(), l.g)) << l.f.name << " float32";
    std::vector<int64_t> ms = {1, 77, 128, 129, 256, 300, 1000};
    if (l.n >= 1280) ms.push_back(4100);  // 4100 x 1280: more tiles than multiprocessors
    ForEachInput(l, ms, {at::kHalf, at::kBFloat16}, [&](const LayerInput& in) {
      ExpectPathMatchesCpu(in.x, l.s, l.g, l.bias, in.ref, CudaPath::kWgmma, in.dt,
                           in.what + " wgmma");
    });
  });
}

// The automatic choice of the warpgroup-MMA kernel (Note [Large-M path choice]).
TEST(QuantCuda, LargeMPathRuleFollowsTheMeasurements) {
  constexpr QuantFormat kInt8 = QuantFormat::kInt8, kNf4 = QuantFormat::kNf4;
  auto rows = [](int64_t m, int64_t k, int64_t n, QuantFormat f, bool dq) {
    const std::optional<cuda::WgmmaTile> tile = WgmmaWins(m, k, n, f, dq);
    return tile ? tile->rows : 0;
  };
  for (QuantFormat f : {kInt8, kNf4}) {
    for (bool dq : {false, true}) {
      if (f == kInt8 && dq) continue;
      // Flux MLP up and SDXL feed-forward: wide layers, small M.
      EXPECT_EQ(rows(77, 3072, 12288, f, dq), 128);
      EXPECT_EQ(rows(154, 3072, 12288, f, dq), 256);
      EXPECT_EQ(rows(256, 1280, 10240, f, dq), 256);
      EXPECT_EQ(rows(512, 3072, 12288, f, dq), 256);
      EXPECT_EQ(rows(64, 3072, 12288, f, dq), 0);
      EXPECT_EQ(rows(8192, 3072, 12288, f, dq), 0);
      EXPECT_EQ(rows(8192, 1280, 10240, f, dq), 0);
      // SD 1.5 GEGLU projection: short and wide.
      EXPECT_EQ(rows(77, 320, 2560, f, dq), 64);
      EXPECT_EQ(rows(256, 320, 2560, f, dq), 64);
      EXPECT_EQ(rows(512, 320, 2560, f, dq), 128);
      EXPECT_EQ(rows(1024, 320, 2560, f, dq), 256);
      EXPECT_EQ(rows(4096, 320, 2560, f, dq), 0);
      // Flux MLP down: deep.
      EXPECT_EQ(rows(77, 12288, 3072, f, dq), 128);
      EXPECT_EQ(rows(512, 12288, 3072, f, dq), 256);
      EXPECT_EQ(rows(8192, 12288, 3072, f, dq), 0);
      // Layers with K > 512 and N <= 1280: dequantize + cuBLAS.
      for (int64_t m : {77, 1024, 4096}) {
        EXPECT_EQ(rows(m, 2048, 1280, f, dq), 0);
        EXPECT_EQ(rows(m, 640, 640, f, dq), 0);
        EXPECT_EQ(rows(m, 768, 320, f, dq), 0);
      }
      // Flux attention below M = 256: dequantize + cuBLAS.
      EXPECT_EQ(rows(77, 3072, 3072, f, dq), 0);
      EXPECT_EQ(rows(154, 3072, 3072, f, dq), 0);
    }
  }
  // int8: wide and deep layers up to M = 4096, Flux attention from M = 256, SD 1.5
  // feed-forward up to M = 512, SD 1.5 attention up to M = 4096.
  EXPECT_EQ(rows(1024, 1280, 10240, kInt8, false), 256);
  EXPECT_EQ(rows(4096, 3072, 12288, kInt8, false), 256);
  EXPECT_EQ(rows(4096, 12288, 3072, kInt8, false), 256);
  EXPECT_EQ(rows(256, 3072, 3072, kInt8, false), 128);
  EXPECT_EQ(rows(1024, 3072, 3072, kInt8, false), 256);
  EXPECT_EQ(rows(4096, 3072, 3072, kInt8, false), 256);
  EXPECT_EQ(rows(77, 1280, 5120, kInt8, false), 64);
  EXPECT_EQ(rows(154, 1280, 5120, kInt8, false), 64);
  EXPECT_EQ(rows(256, 1280, 5120, kInt8, false), 128);
  EXPECT_EQ(rows(512, 1280, 5120, kInt8, false), 256);
  EXPECT_EQ(rows(1024, 1280, 5120, kInt8, false), 0);
  EXPECT_EQ(rows(77, 320, 320, kInt8, false), 64);
  EXPECT_EQ(rows(1024, 320, 320, kInt8, false), 64);
  EXPECT_EQ(rows(4096, 320, 320, kInt8, false), 128);
  EXPECT_EQ(rows(8192, 320, 320, kInt8, false), 0);
  // nf4: wide and deep layers up to M = 1024 (double quant too), not at 4096; without double
  // quant also Flux attention at M = 513-1024, SD 1.5 feed-forward at M = 129-512 and SD 1.5
  // attention up to M = 4096.
  for (bool dq : {false, true}) {
    EXPECT_EQ(rows(512, 1280, 10240, kNf4, dq), 256);
    EXPECT_EQ(rows(1024, 1280, 10240, kNf4, dq), 256);
    EXPECT_EQ(rows(1024, 3072, 12288, kNf4, dq), 256);
    EXPECT_EQ(rows(1024, 12288, 3072, kNf4, dq), 256);
    EXPECT_EQ(rows(4096, 3072, 12288, kNf4, dq), 0);
    EXPECT_EQ(rows(4096, 1280, 10240, kNf4, dq), 0);
    EXPECT_EQ(rows(512, 3072, 3072, kNf4, dq), 0);
    EXPECT_EQ(rows(4096, 3072, 3072, kNf4, dq), 0);
    EXPECT_EQ(rows(77, 1280, 5120, kNf4, dq), 0);
    EXPECT_EQ(rows(1024, 1280, 5120, kNf4, dq), 0);
  }
  EXPECT_EQ(rows(1024, 3072, 3072, kNf4, false), 256);
  EXPECT_EQ(rows(1024, 3072, 3072, kNf4, true), 0);
  EXPECT_EQ(rows(154, 1280, 5120, kNf4, false), 64);
  EXPECT_EQ(rows(256, 1280, 5120, kNf4, false), 128);
  EXPECT_EQ(rows(512, 1280, 5120, kNf4, false), 256);
  EXPECT_EQ(rows(256, 1280, 5120, kNf4, true), 0);
  EXPECT_EQ(rows(1024, 320, 320, kNf4, false), 64);
  EXPECT_EQ(rows(4096, 320, 320, kNf4, false), 128);
  EXPECT_EQ(rows(1024, 320, 320, kNf4, true), 0);
}

TEST(QuantCuda, UnalignedAndBatchedInputs) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(23);
  at::Tensor w = at::randn({64, 128}) * 0.05;
  QuantState s = *Quantize(w, QuantOptions{QuantFormat::kNf4, 64, true});
  QuantState g = ToDevice(s, at::kCUDA);
  // x starting one element into its storage: no 16-byte loads possible.
  at::Tensor storage = at::randn({5 * 128 + 1}, at::kHalf);
  at::Tensor x = storage.slice(0, 1).view({5, 128});
  ExpectClose(QuantLinearCuda(x.cuda().slice(0, 0), g, std::nullopt, CudaPath::kFused),
              QuantLinear(x.to(at::kFloat), s), at::kHalf, "contiguous copy");
  at::Tensor xg_storage = storage.cuda();
  at::Tensor xg = xg_storage.slice(0, 1).view({5, 128});
  ASSERT_NE(reinterpret_cast<uintptr_t>(xg.data_ptr()) % 16, 0u);
  ExpectClose(QuantLinearCuda(xg, g, std::nullopt, CudaPath::kFused),
              QuantLinear(x.to(at::kFloat), s), at::kHalf, "unaligned x");
  // The tensor-core path falls back (its 16-byte loads need alignment) and stays correct.
  ExpectClose(QuantLinearCuda(xg, g, std::nullopt, CudaPath::kMma),
              QuantLinear(x.to(at::kFloat), s), at::kHalf, "unaligned x, mma requested");
  // [B, T, K] input keeps its leading dimensions.
  at::Tensor x3 = at::randn({2, 77, 128}).to(at::kHalf);
  at::Tensor y3 = QuantLinear(x3.cuda(), g);
  EXPECT_EQ(y3.sizes(), at::IntArrayRef({2, 77, 64}));
  ExpectClose(y3, QuantLinear(x3.to(at::kFloat), s), at::kHalf, "3-D x");
  // Format none runs on CUDA too.
  QuantState none = ToDevice(*Quantize(w, QuantOptions{}), at::kCUDA);
  ExpectClose(QuantLinear(x3.cuda(), none), at::linear(x3.to(at::kFloat), w), at::kHalf, "none");
}

TEST(QuantCuda, StateOnAnotherDeviceIsAClearError) {
  SKIP_WITHOUT_CUDA();
  QuantState s = *Quantize(at::randn({16, 64}), QuantOptions{QuantFormat::kNf4, 64, true});
  QuantState g = ToDevice(s, at::kCUDA);
  g.code = g.code.cpu();
  const std::string err = ErrorOf([&] { QuantLinear(at::randn({2, 64}).cuda(), g); });
  EXPECT_NE(err.find("code is on cpu but x is on cuda:0"), std::string::npos) << err;
  QuantState g2 = ToDevice(s, at::kCUDA);
  const std::string err2 = ErrorOf([&] { QuantLinear(at::randn({2, 64}), g2); });
  EXPECT_NE(err2.find("weight is on cuda:0 but x is on cpu"), std::string::npos) << err2;
  if (c10::cuda::device_count() < 2) GTEST_SKIP() << "one GPU: the cuda:0 vs cuda:1 case skipped";
  const at::Tensor x1 = at::randn({2, 64}).to(at::Device(at::kCUDA, 1));
  const std::string err3 = ErrorOf([&] { QuantLinear(x1, g2); });
  EXPECT_NE(err3.find("is on cuda:0 but x is on cuda:1"), std::string::npos) << err3;
  // Everything on cuda:1 works, and the result stays there.
  at::Tensor y = QuantLinear(x1, ToDevice(s, at::Device(at::kCUDA, 1)));
  EXPECT_EQ(y.device(), x1.device());
}

}  // namespace
}  // namespace qpool::quant
