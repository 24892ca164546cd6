// Int8Conv2d (Note [Int8 convolutions]) against cuDNN's fp16 convolution through ATen, on the
// UNets' convolutions for four images with guidance (8 rows of the batch): SDXL's at 1024x1024
// (latent 128x128) and SD 1.5's at 512x512 (latent 64x64), channels-last. `int8` is the
// convolution with its bias (the scales' product included), its inputs already int8 (quantizing
// the activations is a separate pass); `fp16` is at::conv2d with cudnn.benchmark on and the bias,
// `fp16_nobias` the same without it, as the server runs its UNets' convolutions (their biases
// are folded into passes made anyway: Note [Convolution biases]).
//
//   int8_conv_bench --benchmark_out=int8_conv.json --benchmark_out_format=json
//
// Timing as Note [Benchmark methodology] (gpu_timing.h). Counters: us_per_call, TOPS (2 x the
// multiply-adds over the time) and, for int8, first_call_ms: the shape's first call in the process
// (its plan built and tuned), timed on the host around a synchronized call.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "gpu_timing.h"
#include "quant/int8_conv_cuda.h"

namespace qpool {
namespace {

constexpr int kSamples = 15;

struct Conv {
  const char* name;
  int64_t n, c, hw, k, kernel, stride;
};

constexpr Conv kConvs[] = {
    {"sdxl_b4_8x320x128x128_k320_r3", 8, 320, 128, 320, 3, 1},
    {"sdxl_b4_8x960x128x128_k320_r3", 8, 960, 128, 320, 3, 1},
    {"sdxl_b4_8x320x128x128_k320_r3_s2", 8, 320, 128, 320, 3, 2},
    {"sdxl_b4_8x640x64x64_k640_r3", 8, 640, 64, 640, 3, 1},
    {"sdxl_b4_8x1280x32x32_k1280_r3", 8, 1280, 32, 1280, 3, 1},
    {"sdxl_b4_8x2560x32x32_k1280_r3", 8, 2560, 32, 1280, 3, 1},
    {"sdxl_b4_8x960x64x64_k640_r1", 8, 960, 64, 640, 1, 1},
    {"sd15_b4_8x320x64x64_k320_r3", 8, 320, 64, 320, 3, 1},
    {"sd15_b4_8x1280x16x16_k1280_r3", 8, 1280, 16, 1280, 3, 1},
};

enum class Side { kFp16, kFp16NoBias, kInt8 };

void BM_Conv(benchmark::State& state, Conv conv, Side side) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  at::globalContext().setBenchmarkCuDNN(true);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const auto channels_last = at::MemoryFormat::ChannelsLast;
  const int64_t pad = conv.kernel / 2;
  const int64_t out = (conv.hw + 2 * pad - conv.kernel) / conv.stride + 1;
  const double ops = 2.0 * conv.n * out * out * conv.k * conv.c * conv.kernel * conv.kernel;
  const at::Tensor bias = at::randn({conv.k}, cuda);
  double us = 0;
  if (side == Side::kInt8) {
    const auto int8_options = cuda.dtype(at::kChar);
    const at::Tensor x = at::randint(-127, 128, {conv.n, conv.c, conv.hw, conv.hw}, int8_options)
                             .contiguous(channels_last);
    const at::Tensor w =
        at::randint(-127, 128, {conv.k, conv.c, conv.kernel, conv.kernel}, int8_options)
            .contiguous(channels_last);
    const at::Tensor xs = at::rand({1}, cuda) * 1e-2, ws = at::rand({conv.k}, cuda) * 1e-3;
    const auto call = [&] {
      return quant::cuda::Int8Conv2d(x, xs, w, ws, bias, conv.stride, pad, at::kHalf);
    };
    const auto t0 = std::chrono::steady_clock::now();
    call();
    at::cuda::device_synchronize();
    state.counters["first_call_ms"] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    us = bench::MedianMicros(call, state);
    state.SetLabel("Int8Conv2d (cuDNN graph: int8 conv, scales, bias)");
  } else {
    const auto half = cuda.dtype(at::kHalf);
    const at::Tensor x =
        at::randn({conv.n, conv.c, conv.hw, conv.hw}, half).contiguous(channels_last);
    const at::Tensor w = (at::randn({conv.k, conv.c, conv.kernel, conv.kernel}, half) * 0.02)
                             .contiguous(channels_last);
    const at::Tensor b = side == Side::kFp16 ? bias.to(at::kHalf) : at::Tensor();
    us = bench::MedianMicros([&] { return at::conv2d(x, w, b, conv.stride, pad); }, state);
    state.SetLabel(b.defined() ? "at::conv2d fp16 (cuDNN, benchmark mode)"
                               : "at::conv2d fp16, no bias (cuDNN, benchmark mode)");
  }
  state.counters["us_per_call"] = us;
  state.counters["TOPS"] = ops / us * 1e-6;
}

void RegisterAll() {
  for (const Conv& conv : kConvs) {
    for (const auto& [side, suffix] :
         {std::pair{Side::kFp16, "/fp16"}, std::pair{Side::kFp16NoBias, "/fp16_nobias"},
          std::pair{Side::kInt8, "/int8"}}) {
      const std::string name = std::string("int8_conv/") + conv.name + suffix;
      bench::RegisterTimed(name, kSamples, BM_Conv, conv, side);
    }
  }
}

}  // namespace
}  // namespace qpool

int main(int argc, char** argv) {
  return qpool::bench::RunGpuBenchmarks(argc, argv, qpool::kSamples,
                                        "cuDNN's fp16 convolution through at::conv2d timed the "
                                        "same way in the same run",
                                        &qpool::RegisterAll);
}
