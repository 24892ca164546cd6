// qpool::quant_linear on CUDA against torch::linear in fp16/bf16, on the linear shapes of
// SD 1.5, SDXL and Flux, for M (tokens x batch) in {1, 16, 77, 1024, 4096}.
//
//   quant_linear_bench --benchmark_out=quant_linear.json --benchmark_out_format=json
//
// Counters: weight_bytes (bytes of weight + quant state read per call), weight_GBps (those bytes
// per second), fp16_us (torch::linear in fp16 on the same shape, measured in the same run) and
// speedup_vs_fp16 (fp16_us / this time; > 1 is faster than fp16). Without CUDA every benchmark
// reports SkipWithError.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <benchmark/benchmark.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "quant/quant_linear_cuda.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"

namespace qpool::quant {
namespace {

struct LinearShape {
  const char* name;
  int64_t in;   // K
  int64_t out;  // N
};

const LinearShape kShapes[] = {
    {"sd15_attn_320x320", 320, 320},         {"sd15_geglu_320x2560", 320, 2560},
    {"sd15_ff_1280x5120", 1280, 5120},       {"sd15_xattn_kv_768x320", 768, 320},
    {"sdxl_attn_640x640", 640, 640},         {"sdxl_ff_1280x10240", 1280, 10240},
    {"sdxl_xattn_kv_2048x1280", 2048, 1280}, {"flux_attn_3072x3072", 3072, 3072},
    {"flux_mlp_up_3072x12288", 3072, 12288}, {"flux_mlp_down_12288x3072", 12288, 3072},
};

const int64_t kMs[] = {1, 16, 77, 1024, 4096};

struct Variant {
  const char* name;
  QuantFormat format;
  bool double_quant;
  at::ScalarType dtype;
  CudaPath path;
};

const Variant kVariants[] = {
    {"fp16_linear", QuantFormat::kNone, false, at::kHalf, CudaPath::kAuto},
    {"bf16_linear", QuantFormat::kNone, false, at::kBFloat16, CudaPath::kAuto},
    {"int8_fp16", QuantFormat::kInt8, false, at::kHalf, CudaPath::kAuto},
    {"nf4_fp16", QuantFormat::kNf4, false, at::kHalf, CudaPath::kAuto},
    {"nf4dq_fp16", QuantFormat::kNf4, true, at::kHalf, CudaPath::kAuto},
    {"int8_bf16", QuantFormat::kInt8, false, at::kBFloat16, CudaPath::kAuto},
    {"nf4_bf16", QuantFormat::kNf4, false, at::kBFloat16, CudaPath::kAuto},
    // Both algorithms around the crossover (M = 16 and 77), to tune kFusedMaxRows.
    {"int8_fp16_fused", QuantFormat::kInt8, false, at::kHalf, CudaPath::kFused},
    {"int8_fp16_dequant", QuantFormat::kInt8, false, at::kHalf, CudaPath::kDequantMatmul},
    {"nf4_fp16_fused", QuantFormat::kNf4, false, at::kHalf, CudaPath::kFused},
    {"nf4_fp16_dequant", QuantFormat::kNf4, false, at::kHalf, CudaPath::kDequantMatmul},
};

bool ForcedPath(const Variant& v) { return v.path != CudaPath::kAuto; }

// Median time in microseconds of `fn` on the current stream, measured with CUDA events.
template <typename Fn>
double MedianMicros(Fn&& fn, int reps) {
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto stream = at::cuda::getCurrentCUDAStream();
    start.record(stream);
    fn();
    stop.record(stream);
    stop.synchronize();
    t.push_back(start.elapsed_time(stop) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// fp16 torch::linear time per (shape, M), measured once per process.
double Fp16Micros(const LinearShape& s, int64_t m) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  auto key = std::make_tuple(s.in, s.out, m);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  at::Tensor w = at::randn({s.out, s.in}, opts) * 0.02;
  at::Tensor x = at::randn({m, s.in}, opts);
  for (int i = 0; i < 3; ++i) at::linear(x, w);
  const double us = MedianMicros([&] { at::linear(x, w); }, 30);
  cache[key] = us;
  return us;
}

void BM_QuantLinear(benchmark::State& state, LinearShape shape, Variant v, int64_t m) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("CUDA is not available");
    return;
  }
  c10::InferenceMode guard;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(v.dtype);
  at::Tensor w = at::randn({shape.out, shape.in}, opts) * 0.02;
  StatusOr<QuantState> q = Quantize(w, QuantOptions{v.format, 64, v.double_quant});
  if (!q.ok()) {
    state.SkipWithError(q.status().ToString().c_str());
    return;
  }
  const QuantState s = *q;
  if (v.format != QuantFormat::kNone) w.reset();
  at::Tensor x = at::randn({m, shape.in}, opts);
  auto run = [&] {
    if (v.format == QuantFormat::kNone) return at::linear(x, s.weight);
    return QuantLinearCuda(x, s, std::nullopt, v.path);
  };
  for (int i = 0; i < 3; ++i) run();
  torch::cuda::synchronize();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  for (auto _ : state) {
    auto stream = at::cuda::getCurrentCUDAStream();
    start.record(stream);
    at::Tensor y = run();
    stop.record(stream);
    stop.synchronize();
    state.SetIterationTime(start.elapsed_time(stop) * 1e-3);
    benchmark::DoNotOptimize(y);
  }
  const double bytes = static_cast<double>(StateBytes(s));
  const double fp16_us = Fp16Micros(shape, m);
  state.counters["weight_bytes"] = bytes;
  state.counters["weight_GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fp16_us"] = fp16_us;
  state.counters["M"] = static_cast<double>(m);
  state.SetLabel(std::string(shape.name) + " " + v.name);
  // fp16 seconds x iterations / this benchmark's seconds = fp16 time / mean time.
  state.counters["speedup_vs_fp16"] =
      benchmark::Counter(fp16_us * 1e-6, benchmark::Counter::kIsIterationInvariantRate);
}

void RegisterAll() {
  for (const LinearShape& shape : kShapes) {
    for (const Variant& v : kVariants) {
      for (int64_t m : kMs) {
        if (ForcedPath(v) && m != 16 && m != 77) continue;
        const std::string name =
            std::string("quant_linear/") + shape.name + "/" + v.name + "/M:" + std::to_string(m);
        benchmark::RegisterBenchmark(name.c_str(), BM_QuantLinear, shape, v, m)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.02);
      }
    }
  }
}

}  // namespace
}  // namespace qpool::quant

int main(int argc, char** argv) {
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  if (torch::cuda::is_available()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      benchmark::AddCustomContext("device", prop.name);
    }
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
    benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  } else {
    benchmark::AddCustomContext("device", "none (CUDA not available)");
  }
  qpool::quant::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
