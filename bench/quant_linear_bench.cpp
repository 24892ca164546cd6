// qpool::quant_linear on CUDA against torch::linear in fp16/bf16, on the linear shapes of
// SD 1.5, SDXL and Flux, for M (tokens x batch) from 1 to 8192.
//
//   quant_linear_bench --benchmark_out=quant_linear.json --benchmark_out_format=json
//
// Timing as Note [Benchmark methodology] (gpu_timing.h). The weights stay resident between
// calls (L2-warm for the small shapes, same for the fp16/bf16 baselines), unless the process
// runs with --cold: then every benchmark, baselines included, cycles its calls over copies of
// its weight that together fill kColdBytes (four times an H100's L2, at most kMaxColdCopies
// copies), so that each call reads its weight from device memory as a pipeline does, where a
// denoising step reads every layer once.
// Counters (from the median sample): us_per_call, weight_bytes (bytes of weight + quant state
// read per call), weight_GBps (those bytes / us_per_call), fp16_us and bf16_us (torch::linear
// in fp16 / bf16 on the same shape, measured the same way in the same run, once per shape and
// M), ratio_vs_fp16 and ratio_vs_bf16 (this time / baseline; < 1 is faster). The w8a8_product
// family times the warpgroup-MMA w8a8 product alone, for M up to 32768. Without CUDA every
// benchmark reports SkipWithError.
#include <benchmark/benchmark.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_timing.h"
#include "quant/geglu_kernels.h"
#include "quant/quant_linear_cuda.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "quant/w8a8_kernels.h"
#include "quant/w8a8_linear.h"

namespace qpool::quant {
namespace {

struct LinearShape {
  const char* name;
  int64_t in;   // K
  int64_t out;  // N
};

const LinearShape kShapes[] = {
    {"sd15_attn_320x320", 320, 320},
    {"sd15_geglu_320x2560", 320, 2560},
    {"sd15_ff_1280x5120", 1280, 5120},
    {"sd15_xattn_kv_768x320", 768, 320},
    {"sdxl_attn_640x640", 640, 640},
    {"sdxl_attn_1280x1280", 1280, 1280},
    {"sdxl_ff_1280x10240", 1280, 10240},
    {"sdxl_xattn_kv_2048x1280", 2048, 1280},
    {"flux_attn_3072x3072", 3072, 3072},
    {"flux_mlp_up_3072x12288", 3072, 12288},
    {"flux_mlp_down_12288x3072", 12288, 3072},
    // Fused projections (Note [Fused projections] in blocks.py): a UNet self-attention's q / k
    // / v, q / k / v of a FLUX double-stream block, q / k / v and the MLP's input of a
    // single-stream one.
    {"sd15_qkv_320x960", 320, 960},
    {"sdxl_qkv_1280x3840", 1280, 3840},
    {"flux_qkv_3072x9216", 3072, 9216},
    {"flux_qkv_mlp_3072x21504", 3072, 21504},
};

// 2048: SDXL's 1280-wide attention at 1024x1024 with CFG; 4608: FLUX at 1024x1024.
const int64_t kMs[] = {1, 4, 16, 32, 77, 154, 1024, 2048, 4096, 4608, 8192};

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
    {"nf4dq_bf16", QuantFormat::kNf4, true, at::kBFloat16, CudaPath::kAuto},
    // Every algorithm around the crossovers (M = 1, 4, 16, 77), to tune the path choice.
    {"int8_fp16_fused", QuantFormat::kInt8, false, at::kHalf, CudaPath::kFused},
    {"int8_fp16_mma", QuantFormat::kInt8, false, at::kHalf, CudaPath::kMma},
    {"int8_fp16_dequant", QuantFormat::kInt8, false, at::kHalf, CudaPath::kDequantMatmul},
    {"nf4_fp16_fused", QuantFormat::kNf4, false, at::kHalf, CudaPath::kFused},
    {"nf4_fp16_mma", QuantFormat::kNf4, false, at::kHalf, CudaPath::kMma},
    {"nf4_fp16_dequant", QuantFormat::kNf4, false, at::kHalf, CudaPath::kDequantMatmul},
    // w8a8: the automatic product and both int8 products (Note [W8A8 product choice]), at every
    // M where the int8 product runs.
    {"w8a8_fp16", QuantFormat::kW8A8, false, at::kHalf, CudaPath::kAuto},
    {"w8a8_bf16", QuantFormat::kW8A8, false, at::kBFloat16, CudaPath::kAuto},
    {"w8a8_fp16_wgmma", QuantFormat::kW8A8, false, at::kHalf, CudaPath::kWgmma},
    {"w8a8_fp16_intmm", QuantFormat::kW8A8, false, at::kHalf, CudaPath::kIntMatmul},
};

bool ForcedPath(const Variant& v) { return v.path != CudaPath::kAuto; }

using bench::kCallsPerSample;
constexpr int kSamples = 15;
constexpr int64_t kColdBytes = int64_t{200} << 20;
constexpr int64_t kMaxColdCopies = 4000;
bool g_cold = false;  // --cold

// The weights one benchmark cycles over: `one` warm; cold, `one` and clone(one)'s up to
// kColdBytes of `bytes` each (--cold, above).
template <typename W, typename Clone>
std::vector<W> Copies(const W& one, int64_t bytes, Clone clone) {
  const int64_t n =
      g_cold ? std::clamp<int64_t>((kColdBytes + bytes - 1) / std::max<int64_t>(bytes, 1), 1,
                                   kMaxColdCopies)
             : 1;
  std::vector<W> copies{one};
  while (static_cast<int64_t>(copies.size()) < n) copies.push_back(clone(one));
  return copies;
}

// torch::linear time per call in `dtype` per (shape, M, dtype), measured once per process.
double BaselineMicros(const LinearShape& s, int64_t m, at::ScalarType dtype) {
  static std::map<std::tuple<int64_t, int64_t, int64_t, int>, double> cache;
  auto key = std::make_tuple(s.in, s.out, m, static_cast<int>(dtype));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  const at::Tensor w = at::randn({s.out, s.in}, opts) * 0.02;
  const std::vector<at::Tensor> ws =
      Copies(w, w.numel() * w.element_size(), [](const at::Tensor& t) { return t.clone(); });
  at::Tensor x = at::randn({m, s.in}, opts);
  size_t next = 0;
  const double us =
      bench::MedianMicros([&] { return at::linear(x, ws[next++ % ws.size()]); }, kSamples);
  cache[key] = us;
  return us;
}

void BM_QuantLinear(benchmark::State& state, LinearShape shape, Variant v, int64_t m) {
  if (bench::SkippedWithoutCuda(state)) return;
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
  const std::vector<QuantState> copies = Copies(s, StateBytes(s), [](const QuantState& q) {
    const auto clone = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
    return QuantState{clone(q.weight),        clone(q.absmax),      clone(q.code),
                      clone(q.nested_absmax), clone(q.nested_code), clone(q.offset)};
  });
  at::Tensor x = at::randn({m, shape.in}, opts);
  size_t next = 0;
  auto run = [&] {
    const QuantState& c = copies[next++ % copies.size()];
    if (v.format == QuantFormat::kNone) return at::linear(x, c.weight);
    return QuantLinearCuda(x, c, std::nullopt, v.path);
  };
  double host_us = 0;
  const double us = bench::MedianMicros(run, state, &host_us);
  state.counters["host_us"] = host_us;
  const double bytes = static_cast<double>(StateBytes(s));
  const double fp16_us = BaselineMicros(shape, m, at::kHalf);
  const double bf16_us = BaselineMicros(shape, m, at::kBFloat16);
  state.counters["us_per_call"] = us;
  state.counters["weight_bytes"] = bytes;
  state.counters["weight_GBps"] = bytes * 1e-3 / us;
  state.counters["fp16_us"] = fp16_us;
  state.counters["bf16_us"] = bf16_us;
  state.counters["ratio_vs_fp16"] = us / fp16_us;
  state.counters["ratio_vs_bf16"] = us / bf16_us;
  state.counters["M"] = static_cast<double>(m);
  state.counters["calls_per_sample"] = kCallsPerSample;
  state.counters["weight_copies"] = static_cast<double>(copies.size());
  state.SetLabel(std::string(shape.name) + " " + v.name);
}

// The outputs of a quantizing pass over m rows of k values, on the device of `opts`.
struct QuantizedRows {
  at::Tensor q, row_amax, row_scale;
  QuantizedRows(int64_t m, int64_t k, const at::TensorOptions& opts)
      : q(at::empty({m, k}, opts.dtype(at::kChar))),
        row_amax(at::empty({m}, opts.dtype(at::kFloat))),
        row_scale(at::empty({m}, opts.dtype(at::kFloat))) {}
};

// The w8a8 product alone (Note [Warpgroup-MMA W8A8 linear]; rows of x quantized beforehand, no
// bias) with the tiles `tiles` (Note [W8A8 tile choice]); counters as BM_QuantLinear's plus
// TOPS (int8 operations per second, 2 M K N a call) and fp16_TFLOPS (torch::linear's).
void BM_W8A8Product(benchmark::State& state, LinearShape shape, int64_t m, cuda::W8A8Tiles tiles) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const QuantState s = *QuantizeW8A8(at::randn({shape.out, shape.in}, opts) * 0.02,
                                     at::ones({shape.in}, opts.dtype(at::kFloat)));
  const at::Tensor x = at::randn({m, shape.in}, opts);
  const QuantizedRows rows(m, shape.in, opts);
  const at::Tensor& q = rows.q;
  const at::Tensor& row_scale = rows.row_scale;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cuda::LaunchW8A8QuantizeRows(x.data_ptr(), cuda::ElemType::kHalf, s.code.data_ptr<float>(), m,
                               shape.in, q.data_ptr<int8_t>(), rows.row_amax.data_ptr<float>(),
                               row_scale.data_ptr<float>(), stream);
  if (!cuda::W8A8WgmmaSupported(m, shape.in, shape.out, q.data_ptr(), s.weight.data_ptr(),
                                cuda::ElemType::kHalf)) {
    state.SkipWithError("the warpgroup-MMA kernel does not run here");
    return;
  }
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t bytes = cuda::W8A8WgmmaWorkspaceBytes(m, shape.in, shape.out, sm_count, tiles);
  const at::Tensor workspace = at::empty({std::max<int64_t>(bytes, 16)}, opts.dtype(at::kByte));
  const at::Tensor out = at::empty({m, shape.out}, opts);
  auto run = [&] {
    cuda::LaunchW8A8Wgmma(q.data_ptr<int8_t>(), row_scale.data_ptr<float>(),
                          s.weight.data_ptr<int8_t>(), s.absmax.data_ptr<float>(), nullptr,
                          cuda::ElemType::kFloat, m, shape.in, shape.out, out.data_ptr(),
                          cuda::ElemType::kHalf, sm_count, workspace.data_ptr(), stream, tiles);
    return 0;
  };
  const double us = bench::MedianMicros(run, state);
  const double fp16_us = BaselineMicros(shape, m, at::kHalf);
  state.counters["us_per_call"] = us;
  state.counters["fp16_us"] = fp16_us;
  state.counters["ratio_vs_fp16"] = us / fp16_us;
  state.counters["TOPS"] = 2.0 * static_cast<double>(m * shape.in * shape.out) / us * 1e-6;
  state.counters["fp16_TFLOPS"] =
      2.0 * static_cast<double>(m * shape.in * shape.out) / fp16_us * 1e-6;
  state.counters["M"] = static_cast<double>(m);
  state.SetLabel(shape.name);
}

// The w8a8 quantizing pass alone (Note [Held rows]): rows of fp16 x [m, k] to int8, with
// SmoothQuant-like scales. GBps counts the bytes it must move (x read, q and the row maxima and
// scales written); copy_us is a device-to-device copy of as many bytes as x and q hold (read
// and written: the same traffic), the memory-bound floor. `unit`: scales of ones (Note [Unit
// scales]).
void BM_W8A8Quantize(benchmark::State& state, int64_t k, int64_t m, bool unit) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor smooth = unit ? at::ones({k}, opts.dtype(at::kFloat))
                                 : at::pow(10.0, at::rand({k}, opts.dtype(at::kFloat)) * 2 - 1);
  const at::Tensor x = at::randn({m, k}, opts);
  const QuantizedRows out(m, k, opts);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto run = [&] {
    cuda::LaunchW8A8QuantizeRows(x.data_ptr(), cuda::ElemType::kHalf, smooth.data_ptr<float>(), m,
                                 k, out.q.data_ptr<int8_t>(), out.row_amax.data_ptr<float>(),
                                 out.row_scale.data_ptr<float>(), stream);
    return 0;
  };
  const double us = bench::MedianMicros(run, state);
  const at::Tensor from = at::empty({m * k * 3 / 2}, opts.dtype(at::kByte));
  const at::Tensor to = at::empty_like(from);
  const double copy_us = bench::MedianMicros([&] { return to.copy_(from); }, kSamples);
  const double bytes = static_cast<double>(m * k * 3 + m * 8);
  state.counters["us_per_call"] = us;
  state.counters["GBps"] = bytes * 1e-3 / us;
  state.counters["copy_us"] = copy_us;
  state.counters["ratio_vs_copy"] = us / copy_us;
  state.counters["M"] = static_cast<double>(m);
  state.counters["K"] = static_cast<double>(k);
}

// The GEGLU and the quantizing pass of a feed-forward's down projection (Note [GEGLU rows]):
// in one pass (us_per_call) against qpool::geglu's kernel then the quantizing pass (two_pass_us),
// fp16 x [m, 2d].
void BM_W8A8GegluQuantize(benchmark::State& state, int64_t d, int64_t m) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor smooth = at::pow(10.0, at::rand({d}, opts.dtype(at::kFloat)) * 2 - 1);
  const at::Tensor x = at::randn({m, 2 * d}, opts);
  const at::Tensor h = at::empty({m, d}, opts);
  const QuantizedRows out(m, d, opts);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto quantize = [&](const at::Tensor& rows) {
    cuda::LaunchW8A8QuantizeRows(rows.data_ptr(), cuda::ElemType::kHalf, smooth.data_ptr<float>(),
                                 m, d, out.q.data_ptr<int8_t>(), out.row_amax.data_ptr<float>(),
                                 out.row_scale.data_ptr<float>(), stream);
  };
  const double us = bench::MedianMicros(
      [&] {
        cuda::LaunchW8A8GegluQuantizeRows(x.data_ptr(), 2 * d, cuda::ElemType::kHalf,
                                          smooth.data_ptr<float>(), m, d, out.q.data_ptr<int8_t>(),
                                          out.row_amax.data_ptr<float>(),
                                          out.row_scale.data_ptr<float>(), stream);
        return 0;
      },
      state);
  const double two_pass_us = bench::MedianMicros(
      [&] {
        cuda::LaunchGeglu(x.data_ptr(), 2 * d, m, d, h.data_ptr(), cuda::ElemType::kHalf, stream);
        quantize(h);
        return 0;
      },
      kSamples);
  state.counters["us_per_call"] = us;
  state.counters["two_pass_us"] = two_pass_us;
  state.counters["ratio_vs_two_pass"] = us / two_pass_us;
  state.counters["GBps"] = static_cast<double>(m * d * 5 + m * 8) * 1e-3 / us;
  state.counters["M"] = static_cast<double>(m);
  state.counters["D"] = static_cast<double>(d);
}

void RegisterAll() {
  // SD 1.5's and SDXL's row widths (320-1280 model widths, 2048 text, 5120 feed-forward).
  for (bool unit : {false, true}) {
    for (int64_t k : {320, 640, 1280, 2048, 5120}) {
      for (int64_t m : {616, 8192, 32768}) {
        const std::string name = std::string(unit ? "w8a8_quantize_unit" : "w8a8_quantize") +
                                 "/K:" + std::to_string(k) + "/M:" + std::to_string(m);
        bench::RegisterTimed(name, kSamples, BM_W8A8Quantize, k, m, unit);
      }
    }
  }
  // Feed-forward widths and rows at four images: SD 1.5's 1280 (32768 rows) and 2560 (8192),
  // SDXL's 2560 (32768) and 5120 (8192).
  for (int64_t d : {1280, 2560, 5120}) {
    for (int64_t m : {8192, 32768}) {
      const std::string name =
          "w8a8_geglu_quantize/D:" + std::to_string(d) + "/M:" + std::to_string(m);
      bench::RegisterTimed(name, kSamples, BM_W8A8GegluQuantize, d, m);
    }
  }
  const std::pair<const char*, cuda::W8A8Tiles> tile_kinds[] = {
      {"auto", cuda::W8A8Tiles::kAuto},
      {"shared", cuda::W8A8Tiles::kShared},
      {"pingpong", cuda::W8A8Tiles::kPingPong}};
  for (const LinearShape& shape : kShapes) {
    for (int64_t m : {1024, 2048, 4096, 8192, 16384, 32768}) {
      for (const auto& [tiles_name, tiles] : tile_kinds) {
        const std::string name = std::string("w8a8_product/") + shape.name +
                                 "/M:" + std::to_string(m) + "/" + tiles_name;
        bench::RegisterTimed(name, kSamples, BM_W8A8Product, shape, m, tiles);
      }
    }
  }
  for (const LinearShape& shape : kShapes) {
    for (const Variant& v : kVariants) {
      for (int64_t m : kMs) {
        if (v.format == QuantFormat::kW8A8 && m < kW8A8MinRows) continue;
        if (ForcedPath(v) && v.format != QuantFormat::kW8A8 && m != 1 && m != 4 && m != 16 &&
            m != 77) {
          continue;
        }
        if (v.path == CudaPath::kMma && m > 16) continue;
        const std::string name =
            std::string("quant_linear/") + shape.name + "/" + v.name + "/M:" + std::to_string(m);
        bench::RegisterTimed(name, kSamples, BM_QuantLinear, shape, v, m);
      }
    }
  }
}

}  // namespace
}  // namespace qpool::quant

int main(int argc, char** argv) {
  // --cold is ours; the rest goes to Google Benchmark.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--cold") {
      qpool::quant::g_cold = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::AddCustomContext("weights",
                              qpool::quant::g_cold
                                  ? "cold: calls cycle over copies filling 200 MB (weight_copies)"
                                  : "warm: one weight per benchmark, reused by every call");
  return qpool::bench::RunGpuBenchmarks(
      argc, argv, qpool::quant::kSamples,
      "fp16/bf16 torch::linear baselines measured the same way in the same run",
      &qpool::quant::RegisterAll);
}
