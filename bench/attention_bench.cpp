// aten::scaled_dot_product_attention with each fused backend put first (Note [Attention
// backend]) on the attention shapes of SD 1.5 (512x512), SDXL and FLUX (1024x1024), against
// PyTorch's own order in the same run: the measurement behind `--attention`; and FLUX's rotary
// embedding as qpool::rope against the ATen operations it replaces.
//
//   attention_bench --benchmark_out=attention.json --benchmark_out_format=json
//
// Timing as Note [Benchmark methodology] (gpu_timing.h). A backend that cannot take a shape
// (cuDNN's head sizes stop at 128) is reported as skipped with the backend ATen would pick
// instead, so no row times a fallback under another name. Counters: us_per_call, TFLOPs (4 B H
// Lq Lkv D / time), default_us (PyTorch's order, its backend in the label) and
// ratio_vs_default (< 1 is faster).
#include <ATen/Context.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "component/attention_backend.h"
#include "gpu_timing.h"
#include "quant/rope_op.h"

namespace qpool {
namespace {

struct AttentionShape {
  const char* name;
  int64_t batch, heads, lq, lkv, head_dim;
  at::ScalarType dtype;
};

// Batch 2 for the UNets (a prompt and its negative, CFG); FLUX attends over its 4096 image
// tokens and 512 text tokens jointly.
const AttentionShape kShapes[] = {
    {"sd15_self_64x64_d40", 2, 8, 4096, 4096, 40, at::kHalf},
    {"sd15_cross_64x64_d40", 2, 8, 4096, 77, 40, at::kHalf},
    {"sd15_self_32x32_d80", 2, 8, 1024, 1024, 80, at::kHalf},
    {"sd15_self_16x16_d160", 2, 8, 256, 256, 160, at::kHalf},
    {"sdxl_self_64x64_d64", 2, 10, 4096, 4096, 64, at::kHalf},
    {"sdxl_cross_64x64_d64", 2, 10, 4096, 77, 64, at::kHalf},
    {"sdxl_self_32x32_d64", 2, 20, 1024, 1024, 64, at::kHalf},
    {"flux_joint_4608_d128", 1, 24, 4608, 4608, 128, at::kBFloat16},
};

const char* const kBackends[] = {"flash", "cudnn", "efficient"};

constexpr int kSamples = 15;

void BM_Attention(benchmark::State& state, AttentionShape s, std::string backend) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  SettleAttentionOrder(0);  // ATen's own order, as a server has it (Note [Attention backend])
  const std::vector<int64_t> pytorch = CurrentAttentionPriority();
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(s.dtype);
  const at::Tensor q = at::randn({s.batch, s.heads, s.lq, s.head_dim}, opts);
  const at::Tensor k = at::randn({s.batch, s.heads, s.lkv, s.head_dim}, opts);
  const at::Tensor v = at::randn({s.batch, s.heads, s.lkv, s.head_dim}, opts);
  auto run = [&] { return at::scaled_dot_product_attention(q, k, v); };
  const int64_t default_choice = at::_fused_sdp_choice(q, k, v);
  const double default_us = bench::MedianMicros(run, kSamples);
  (void)ApplyAttentionBackend(backend, 0);
  const std::string chosen = DescribeAttentionPriority({at::_fused_sdp_choice(q, k, v)});
  if (chosen != backend) {
    at::globalContext().setSDPPriorityOrder(pytorch);
    state.SkipWithError((backend + " cannot take this call; ATen picks " + chosen).c_str());
    return;
  }
  const double us = bench::MedianMicros(run, state);
  at::globalContext().setSDPPriorityOrder(pytorch);
  const double flop = 4.0 * s.batch * s.heads * s.lq * s.lkv * s.head_dim;
  state.counters["us_per_call"] = us;
  state.counters["TFLOPs"] = flop / us * 1e-6;
  state.counters["default_us"] = default_us;
  state.counters["ratio_vs_default"] = us / default_us;
  state.SetLabel(std::string(s.name) + " " + backend +
                 " (default: " + DescribeAttentionPriority({default_choice}) + ")");
}

// qpool::rope (Note [Rotary embedding op]) on q of a 1024x1024 FLUX image against the same
// rotation in ATen operations (diffusers' apply_rotary_emb, RopeCpu's body) on the GPU.
void BM_Rope(benchmark::State& state, bool fused) {
  if (bench::SkippedWithoutCuda(state)) return;
  c10::InferenceMode guard;
  const int64_t n = 4608, heads = 24, d = 128;
  auto opts = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({1, n, heads, d}, opts.dtype(at::kBFloat16));
  const at::Tensor angles = at::rand({1, n, 1, d}, opts) * 100;
  const at::Tensor cos = at::cos(angles), sin = at::sin(angles);
  auto run = [&] { return fused ? quant::Rope(x, cos, sin) : quant::RopeCpu(x, cos, sin); };
  const double us = bench::MedianMicros(run, state);
  state.counters["us_per_call"] = us;
  // x read and the result written once: the traffic the one-pass kernel needs.
  state.counters["min_bytes_GBps"] = 2.0 * x.numel() * x.element_size() / us * 1e-3;
  state.SetLabel(fused ? "qpool::rope" : "ATen operations");
}

void RegisterAll() {
  for (bool fused : {false, true}) {
    bench::RegisterTimed(
        fused ? "rope/flux_q_4608x24x128_bf16/qpool" : "rope/flux_q_4608x24x128_bf16/aten",
        kSamples, BM_Rope, fused);
  }
  for (const AttentionShape& s : kShapes) {
    for (const char* backend : kBackends) {
      const std::string name = std::string("attention/") + s.name + "/" + backend;
      bench::RegisterTimed(name, kSamples, BM_Attention, s, std::string(backend));
    }
  }
}

}  // namespace
}  // namespace qpool

int main(int argc, char** argv) {
  return qpool::bench::RunGpuBenchmarks(argc, argv, qpool::kSamples,
                                        "PyTorch's own backend order timed the same way in the "
                                        "same run",
                                        &qpool::RegisterAll);
}
