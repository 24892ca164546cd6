// The fused elementwise ops, each against the ATen operations it replaces, run on the GPU in the
// same run. FLUX's at a 1024x1024 image's shapes (4096 image and 512 text tokens, width 3072, 24
// heads of 128): qpool::rms_rope (Note [Normed rotary embedding op]) on a double-stream block's
// q, qpool::ada_norm (Note [Modulated norm op]) on the joint sequence, qpool::cat_gelu (Note
// [Joined GELU op]) on a single-stream block's attention output and MLP branch. The inputs are the
// views the traced transformer hands them (q of a fused q / k / v projection, the MLP branch of
// the fused q / k / v / MLP one, shift and scale of one modulation output). And the UNets':
// qpool::geglu (Note [GEGLU op]) on a transformer block's feed-forward projection at both of
// SDXL's attention levels (4096 tokens of width 640, 1024 of width 1280; inner width 4x) for 4
// images with guidance (8 rows of the batch), fp16; and qpool::group_norm (Note [Group norm op])
// as a resnet block's norm2 (the time embedding's addition, the norm, the SiLU) at SDXL's three
// widths for the same batch of 8, channels-last fp16, 32 groups; and qpool::bias_residual (Note
// [Convolution biases]) as a resnet block's conv2 bias and residual at the same shapes; and
// qpool::add_layer_norm and qpool::layer_norm (Note [Residual layer norm]) as a transformer
// block's norm2 (the residual addition and the norm) and norm1 at SDXL's two attention levels;
// and norm2 quantizing its rows for a w8a8 linear (Note [Quantized norm rows]), against the norm's
// kernel then the quantizing pass; and qpool::upsample_nearest (Note [Upsample op]) doubling
// SDXL's UNet upsampler input at the same batch (fp16) and its VAE decoder's last upsampler input
// at one image (float32), channels-last, against aten::upsample_nearest2d.
//
//   flux_ops_bench --benchmark_out=flux_ops.json --benchmark_out_format=json
//
// Timing as Note [Benchmark methodology] (gpu_timing.h). Counters: us_per_call and
// min_bytes_GBps (the bytes the one-pass kernel must read and write, over the time).
#include <ATen/cuda/CUDAContext.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <tuple>

#include "gpu_timing.h"
#include "quant/ada_norm_op.h"
#include "quant/bias_residual_op.h"
#include "quant/cat_gelu_op.h"
#include "quant/geglu_op.h"
#include "quant/group_norm_op.h"
#include "quant/layer_norm_kernels.h"
#include "quant/layer_norm_op.h"
#include "quant/rope_op.h"
#include "quant/upsample_op.h"
#include "quant/w8a8_kernels.h"

namespace qpool {
namespace {

constexpr int kSamples = 15;
constexpr int64_t kText = 512, kImage = 4096, kTokens = kText + kImage, kWidth = 3072, kHeads = 24,
                  kHead = 128, kMlp = 4 * kWidth;

at::TensorOptions Bf16() { return at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16); }

// One op's inputs and both ways of running it.
struct Case {
  std::function<at::Tensor()> fused, aten;
  double min_bytes = 0;
  const char* baseline = "ATen operations";  // what `aten` runs
};

Case RmsRopeCase() {
  // q of each stream: the first third of its fused q / k / v projection, in heads.
  const auto q = [](int64_t n) {
    return at::randn({1, n, 3 * kWidth}, Bf16()).slice(2, 0, kWidth).unflatten(-1, {kHeads, kHead});
  };
  const at::Tensor text = q(kText), image = q(kImage);
  const at::Tensor wt = at::randn({kHead}, Bf16()), wi = at::randn({kHead}, Bf16());
  const at::Tensor angles = at::rand({1, kTokens, 1, kHead}, Bf16().dtype(at::kFloat)) * 100;
  const at::Tensor cos = at::cos(angles), sin = at::sin(angles);
  Case c;
  c.fused = [=] { return quant::RmsRope({text, image}, {wt, wi}, 1e-6, cos, sin); };
  c.aten = [=] { return quant::RmsRopeCpu({text, image}, {wt, wi}, 1e-6, cos, sin); };
  c.min_bytes = 2.0 * kTokens * kWidth * 2;
  return c;
}

Case AdaNormCase() {
  const at::Tensor x = at::randn({1, kTokens, kWidth}, Bf16());
  const at::Tensor mod = at::randn({1, 3 * kWidth}, Bf16());
  const at::Tensor shift = mod.slice(1, 0, kWidth), scale = mod.slice(1, kWidth, 2 * kWidth);
  Case c;
  c.fused = [=] { return quant::AdaNorm(x, shift, scale, 1e-6); };
  c.aten = [=] { return quant::AdaNormCpu(x, shift, scale, 1e-6); };
  c.min_bytes = 2.0 * kTokens * kWidth * 2;
  return c;
}

Case CatGeluCase() {
  const at::Tensor attn = at::randn({1, kTokens, kWidth}, Bf16());
  const at::Tensor mlp = at::randn({1, kTokens, 3 * kWidth + kMlp}, Bf16()).slice(2, 3 * kWidth);
  Case c;
  c.fused = [=] { return quant::CatGelu(attn, mlp); };
  c.aten = [=] { return quant::CatGeluCpu(attn, mlp); };
  c.min_bytes = 2.0 * kTokens * (kWidth + kMlp) * 2;
  return c;
}

// A feed-forward projection's output [8, tokens, 2 * 4 * width] in fp16.
Case GegluCase(int64_t tokens, int64_t width) {
  const int64_t batch = 8, inner = 4 * width;
  const at::Tensor x =
      at::randn({batch, tokens, 2 * inner}, at::TensorOptions().device(at::kCUDA).dtype(at::kHalf));
  Case c;
  c.fused = [=] { return quant::Geglu(x); };
  c.aten = [=] { return quant::GegluCpu(x); };
  c.min_bytes = 3.0 * batch * tokens * inner * 2;
  return c;
}

Case GegluSdxl64Case() { return GegluCase(4096, 640); }
Case GegluSdxl32Case() { return GegluCase(1024, 1280); }

// A resnet block's norm2 on x [8, channels, side, side] channels-last fp16: the time embedding's
// addition, 32 groups, the SiLU.
Case GroupNormCase(int64_t channels, int64_t side) {
  const int64_t batch = 8;
  const at::TensorOptions half = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x =
      at::randn({batch, channels, side, side}, half).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor weight = at::randn({channels}, half), bias = at::randn({channels}, half);
  const at::Tensor add = at::randn({batch, channels}, half);
  Case c;
  c.fused = [=] { return quant::GroupNorm(x, weight, bias, 32, 1e-5, add, true); };
  c.aten = [=] { return quant::GroupNormCpu(x, weight, bias, 32, 1e-5, add, true); };
  c.min_bytes = 2.0 * batch * channels * side * side * 2;
  return c;
}

Case GroupNormSdxl128Case() { return GroupNormCase(320, 128); }
Case GroupNormSdxl64Case() { return GroupNormCase(640, 64); }
Case GroupNormSdxl32Case() { return GroupNormCase(1280, 32); }

// A resnet block's end on [8, channels, side, side] channels-last fp16: conv2's bias-free output,
// its bias, the residual.
Case BiasResidualCase(int64_t channels, int64_t side) {
  const int64_t batch = 8;
  const at::TensorOptions half = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const auto map = [&] {
    return at::randn({batch, channels, side, side}, half)
        .contiguous(at::MemoryFormat::ChannelsLast);
  };
  const at::Tensor x = map(), residual = map(), bias = at::randn({channels}, half);
  Case c;
  c.fused = [=] { return quant::BiasResidual(x, bias, residual); };
  c.aten = [=] { return quant::BiasResidualCpu(x, bias, residual); };
  c.min_bytes = 3.0 * batch * channels * side * side * 2;
  return c;
}

Case BiasResidualSdxl128Case() { return BiasResidualCase(320, 128); }
Case BiasResidualSdxl32Case() { return BiasResidualCase(1280, 32); }

// An upsampler's input [batch, channels, side, side] channels-last, doubled.
Case UpsampleCase(int64_t batch, int64_t channels, int64_t side, at::ScalarType type) {
  const at::Tensor x =
      at::randn({batch, channels, side, side}, at::TensorOptions().device(at::kCUDA).dtype(type))
          .contiguous(at::MemoryFormat::ChannelsLast);
  Case c;
  c.fused = [=] { return quant::UpsampleNearest(x, std::nullopt); };
  c.aten = [=] { return quant::UpsampleNearestCpu(x, std::nullopt); };
  c.min_bytes = 5.0 * x.numel() * x.element_size();  // read once, written four times
  c.baseline = "aten::upsample_nearest2d";
  return c;
}

Case UpsampleSdxlUnetCase() { return UpsampleCase(8, 1280, 32, at::kHalf); }
Case UpsampleSdxlVaeCase() { return UpsampleCase(1, 256, 512, at::kFloat); }

// A transformer block's norm of `tokens` rows of `width` values for 4 images with guidance,
// after the residual addition (`residual`) or alone.
Case LayerNormCase(int64_t tokens, int64_t width, bool residual) {
  const at::TensorOptions half = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x = at::randn({8, tokens, width}, half);
  const at::Tensor r = at::randn({8, tokens, width}, half);
  const at::Tensor weight = at::randn({width}, half), bias = at::randn({width}, half);
  Case c;
  if (residual) {
    c.fused = [=] { return std::get<1>(quant::AddLayerNorm(x, r, weight, bias, 1e-5)); };
    c.aten = [=] { return std::get<1>(quant::AddLayerNormCpu(x, r, weight, bias, 1e-5)); };
  } else {
    c.fused = [=] { return quant::LayerNorm(x, weight, bias, 1e-5); };
    c.aten = [=] { return quant::LayerNormCpu(x, weight, bias, 1e-5); };
  }
  c.min_bytes = (residual ? 4.0 : 2.0) * 8 * tokens * width * 2;
  return c;
}

// Note [Quantized norm rows]: the norm that quantizes its rows for a w8a8 linear (scales of
// ones), against the norm's kernel then the quantizing pass, at the same shapes.
Case QuantizedNormRowsCase(int64_t tokens, int64_t width) {
  const at::TensorOptions half = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x = at::randn({8, tokens, width}, half);
  const at::Tensor r = at::randn({8, tokens, width}, half);
  const at::Tensor weight = at::randn({width}, half), bias = at::randn({width}, half);
  const at::Tensor smooth = at::ones({width}, half.dtype(at::kFloat));
  const at::Tensor sum = at::empty_like(x), out = at::empty_like(x);
  const at::Tensor q = at::empty(x.sizes(), half.dtype(at::kChar));
  const at::Tensor amax = at::empty({8 * tokens}, half.dtype(at::kFloat));
  const at::Tensor scale = at::empty({8 * tokens}, half.dtype(at::kFloat));
  quant::cuda::LayerNormArgs a;
  a.x = x.data_ptr();
  a.residual = r.data_ptr();
  a.weight = weight.data_ptr();
  a.bias = bias.data_ptr();
  a.sum = sum.data_ptr();
  a.rows = 8 * tokens;
  a.d = width;
  a.eps = 1e-5f;
  a.type = quant::cuda::ElemType::kHalf;
  quant::cuda::LayerNormArgs rows = a;
  rows.smooth = smooth.data_ptr<float>();
  rows.q = q.data_ptr<int8_t>();
  rows.row_amax = amax.data_ptr<float>();
  rows.row_scale = scale.data_ptr<float>();
  a.out = out.data_ptr();
  Case c;
  c.fused = [=] {
    quant::cuda::LaunchLayerNorm(rows, at::cuda::getCurrentCUDAStream());
    return q;
  };
  c.aten = [=] {
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    quant::cuda::LaunchLayerNorm(a, stream);
    quant::cuda::LaunchW8A8QuantizeRows(
        out.data_ptr(), quant::cuda::ElemType::kHalf, smooth.data_ptr<float>(), 8 * tokens, width,
        q.data_ptr<int8_t>(), amax.data_ptr<float>(), scale.data_ptr<float>(), stream);
    return q;
  };
  c.baseline = "qpool::add_layer_norm's kernel, then the quantizing pass";
  c.min_bytes = 8.0 * tokens * width * (2 + 2 + 2 + 1);
  return c;
}

Case QuantizedNormRowsSdxl4096Case() { return QuantizedNormRowsCase(4096, 640); }
Case QuantizedNormRowsSdxl1024Case() { return QuantizedNormRowsCase(1024, 1280); }

Case AddLayerNormSdxl4096Case() { return LayerNormCase(4096, 640, true); }
Case AddLayerNormSdxl1024Case() { return LayerNormCase(1024, 1280, true); }
Case LayerNormSdxl4096Case() { return LayerNormCase(4096, 640, false); }
Case LayerNormSdxl1024Case() { return LayerNormCase(1024, 1280, false); }

void BM_Op(benchmark::State& state, Case (*make)(), bool fused) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  const Case c = make();
  const double us = bench::MedianMicros(fused ? c.fused : c.aten, state);
  state.counters["us_per_call"] = us;
  state.counters["min_bytes_GBps"] = c.min_bytes / us * 1e-3;
  state.SetLabel(fused ? "qpool op" : c.baseline);
}

void RegisterAll() {
  struct Named {
    const char* name;
    Case (*make)();
  };
  for (const Named& op :
       {Named{"rms_rope/flux_joint_q_4608x24x128_bf16", &RmsRopeCase},
        Named{"ada_norm/flux_joint_4608x3072_bf16", &AdaNormCase},
        Named{"cat_gelu/flux_single_4608x3072+12288_bf16", &CatGeluCase},
        Named{"geglu/sdxl_b4_8x4096x640_fp16", &GegluSdxl64Case},
        Named{"geglu/sdxl_b4_8x1024x1280_fp16", &GegluSdxl32Case},
        Named{"group_norm/sdxl_b4_8x320x128x128_fp16", &GroupNormSdxl128Case},
        Named{"group_norm/sdxl_b4_8x640x64x64_fp16", &GroupNormSdxl64Case},
        Named{"group_norm/sdxl_b4_8x1280x32x32_fp16", &GroupNormSdxl32Case},
        Named{"bias_residual/sdxl_b4_8x320x128x128_fp16", &BiasResidualSdxl128Case},
        Named{"bias_residual/sdxl_b4_8x1280x32x32_fp16", &BiasResidualSdxl32Case},
        Named{"upsample/sdxl_unet_b4_8x1280x32x32_fp16", &UpsampleSdxlUnetCase},
        Named{"upsample/sdxl_vae_1x256x512x512_fp32", &UpsampleSdxlVaeCase},
        Named{"add_layer_norm/sdxl_b4_8x4096x640_fp16", &AddLayerNormSdxl4096Case},
        Named{"add_layer_norm/sdxl_b4_8x1024x1280_fp16", &AddLayerNormSdxl1024Case},
        Named{"layer_norm/sdxl_b4_8x4096x640_fp16", &LayerNormSdxl4096Case},
        Named{"layer_norm/sdxl_b4_8x1024x1280_fp16", &LayerNormSdxl1024Case},
        Named{"quantized_norm_rows/sdxl_b4_8x4096x640_fp16", &QuantizedNormRowsSdxl4096Case},
        Named{"quantized_norm_rows/sdxl_b4_8x1024x1280_fp16", &QuantizedNormRowsSdxl1024Case}}) {
    for (bool fused : {false, true}) {
      const std::string name = std::string(op.name) + (fused ? "/qpool" : "/aten");
      bench::RegisterTimed(name, kSamples, BM_Op, op.make, fused);
    }
  }
}

}  // namespace
}  // namespace qpool

int main(int argc, char** argv) {
  return qpool::bench::RunGpuBenchmarks(argc, argv, qpool::kSamples,
                                        "the ATen operations timed the same way in the same run",
                                        &qpool::RegisterAll);
}
