// End-to-end latency and GPU memory of the sequential offload policy (streaming) against `none`
// and `model`, side by side in one process on one GPU.
//
//   streaming_bench --repository /models --pipelines sd15,sd15-nf4 [--device cuda:0]
//                   [--group-mib 64,16] [--prefetch 2] [--resident-mib 0] [--steps 30] [--size 512]
//                   [--rounds 3] [--requests 3] [--out streaming.json]
//
// Each pipeline is loaded once per group size with `offload: sequential` (so that it can switch
// policy; Note [Streaming]). With the first group size the policies alternate round by round
// (SetOffloadPolicy between rounds, one warm-up request per round, then --requests timed ones);
// further group sizes measure `sequential` only. Per request: wall time of Generate (it returns
// host PNGs, so the GPU work is done), the GPU's peak allocated bytes above the pipeline's
// resting allocation (ResetPeak before), and what the UNet's stream event says.
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "config/model_repository.h"
#include "memory/device_memory.h"
#include "pipeline/pipeline_kinds.h"
#include "util/clock.h"

namespace qpool {
namespace {

using bench::Median;
using bench::Split;

using Clock = std::chrono::steady_clock;

struct Options {
  std::string repository;
  std::vector<std::string> pipelines;
  std::string device = "cuda:0";
  std::vector<double> group_mib = {64};
  int prefetch = 2;
  double resident_mib = 0;
  int steps = 30;
  int size = 512;
  int rounds = 3;
  int requests = 3;
  std::vector<std::string> policies = {"none", "model", "sequential"};
  std::string out;
};

struct Samples {
  std::vector<double> seconds, denoise, peak_mib;
  std::string stream_message;  // the UNet's last stream event
};

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// Measures one pipeline loaded for streaming with `group_mib`; returns JSON rows.
std::vector<std::string> Measure(const Options& o, const std::string& name, double group_mib,
                                 bool all_policies, ArenaAllocator& arenas, BlockCopier& copier,
                                 DeviceMemory& memory, MemoryEventLog& events) {
  const c10::Device device(o.device);
  const auto kinds = PipelineKinds::Builtin();
  auto repository = ModelRepository::Open(o.repository, kinds->Catalog());
  if (!repository.ok()) throw std::runtime_error(repository.status().ToString());
  auto manifest = repository->LoadManifest(name);
  if (!manifest.ok()) throw std::runtime_error(manifest.status().ToString());
  manifest->offload.mode = OffloadMode::kSequential;
  manifest->offload.stream.group_mib = group_mib;
  manifest->offload.stream.prefetch = o.prefetch;
  manifest->offload.stream.resident_mib = o.resident_mib;
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
  const uint64_t base = memory.Read(device).allocated_bytes;
  auto loaded = kinds->Load(*manifest, device, c10::kHalf,
                            ResidencyContext{&arenas, &copier, &memory, &events});
  if (!loaded.ok()) throw std::runtime_error(loaded.status().ToString());
  Pipeline& pipeline = **loaded;
  uint64_t pipeline_bytes = 0, unet_bytes = 0;
  for (const auto& c : pipeline.components()) {
    pipeline_bytes += c->Bytes().total();
    if (c->name() == "unet") unet_bytes = c->Bytes().total();
  }
  GenerateParams params;
  params.prompt = "a lighthouse on a cliff at dawn";
  params.steps = o.steps;
  params.width = params.height = o.size;
  params.guidance_scale = 7.5;
  params.scheduler = "ddim";
  params.seed = 1;
  const std::vector<std::string> policies =
      all_policies ? o.policies : std::vector<std::string>{"sequential"};
  std::map<std::string, Samples> samples;
  for (int round = 0; round < o.rounds; ++round) {
    for (const auto& policy_name : policies) {
      auto policy = MakeOffloadPolicy(policy_name, 300, {group_mib, o.prefetch, o.resident_mib});
      if (!policy.ok()) throw std::runtime_error(policy.status().ToString());
      Status set = pipeline.residency().SetPolicy(*policy);
      if (!set.ok()) throw std::runtime_error(set.ToString());
      if (!pipeline.Generate(params, nullptr, nullptr).ok()) throw std::runtime_error("warm-up");
      cudaDeviceSynchronize();
      const uint64_t rest = memory.Read(device).allocated_bytes;
      Samples& s = samples[policy_name];
      for (int r = 0; r < o.requests; ++r) {
        memory.ResetPeak(device);
        const uint64_t seen = events.last_sequence();
        const auto start = Clock::now();
        auto out = pipeline.Generate(params, nullptr, nullptr);
        const double seconds = SecondsSince(start);
        if (!out.ok()) throw std::runtime_error(out.status().ToString());
        const uint64_t peak = memory.Read(device).peak_allocated_bytes;
        s.seconds.push_back(seconds);
        s.denoise.push_back(out->timings.denoise_seconds);
        s.peak_mib.push_back(static_cast<double>(peak - std::min(peak, rest)) / (1 << 20));
        for (const auto& e : events.Since(seen)) {
          if (e.kind == MemoryEventKind::kStream && e.component == "unet") {
            s.stream_message = e.message;
          }
        }
      }
    }
  }
  cudaDeviceSynchronize();
  std::vector<std::string> rows;
  const double none_p50 = samples.count("none") ? Median(samples["none"].seconds) : 0;
  for (const auto& [policy, s] : samples) {
    std::ostringstream row;
    row << "{\"pipeline\": " << Json(name) << ", \"policy\": " << Json(policy)
        << ", \"group_mib\": " << group_mib << ", \"prefetch\": " << o.prefetch
        << ", \"resident_mib\": " << o.resident_mib << ", \"steps\": " << o.steps
        << ", \"size\": " << o.size << ", \"requests\": " << s.seconds.size()
        << ", \"p50_seconds\": " << Median(s.seconds)
        << ", \"min_seconds\": " << *std::min_element(s.seconds.begin(), s.seconds.end())
        << ", \"denoise_p50_seconds\": " << Median(s.denoise) << ", \"vs_none\": "
        << (none_p50 > 0 ? std::to_string(Median(s.seconds) / none_p50) : std::string("null"))
        << ", \"peak_above_rest_mib\": " << Median(s.peak_mib)
        << ", \"pipeline_mib\": " << pipeline_bytes / double(1 << 20)
        << ", \"unet_mib\": " << unet_bytes / double(1 << 20) << ", \"load_allocated_mib\": "
        << (memory.Read(device).allocated_bytes - base) / double(1 << 20)
        << ", \"unet_stream\": " << Json(s.stream_message) << "}";
    rows.push_back(row.str());
    std::cout << rows.back() << std::endl;
  }
  return rows;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--repository")
      o.repository = value;
    else if (flag == "--pipelines")
      o.pipelines = Split(value);
    else if (flag == "--device")
      o.device = value;
    else if (flag == "--group-mib") {
      o.group_mib.clear();
      for (const auto& g : Split(value)) o.group_mib.push_back(std::stod(g));
    } else if (flag == "--prefetch")
      o.prefetch = std::stoi(value);
    else if (flag == "--resident-mib")
      o.resident_mib = std::stod(value);
    else if (flag == "--steps")
      o.steps = std::stoi(value);
    else if (flag == "--size")
      o.size = std::stoi(value);
    else if (flag == "--rounds")
      o.rounds = std::stoi(value);
    else if (flag == "--requests")
      o.requests = std::stoi(value);
    else if (flag == "--policies")
      o.policies = Split(value);
    else if (flag == "--out")
      o.out = value;
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (o.repository.empty() || o.pipelines.empty() || o.group_mib.empty()) {
    std::cerr << "usage: streaming_bench --repository DIR --pipelines a,b [--device cuda:0] "
                 "[--group-mib 64,16] [--prefetch 2] [--resident-mib 0] [--steps 30] [--size 512] "
                 "[--rounds 3] "
                 "[--requests 3] [--policies none,model,sequential] [--out FILE]\n";
    return 2;
  }
  if (c10::Device(o.device).is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "streaming_bench: no CUDA device (--device cpu runs it on the CPU)\n";
    return 1;
  }
  torch::empty({1}, torch::TensorOptions().device(c10::Device(o.device)));  // allocator stats
  ArenaAllocator arenas;
  BlockCopier copier;
  DeviceMemory memory(arenas);
  MemoryEventLog events;
  std::vector<std::string> rows;
  try {
    for (const auto& name : o.pipelines) {
      for (size_t g = 0; g < o.group_mib.size(); ++g) {
        for (auto& row : Measure(o, name, o.group_mib[g], g == 0, arenas, copier, memory, events)) {
          rows.push_back(std::move(row));
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "streaming_bench: " << e.what() << "\n";
    return 1;
  }
  if (!o.out.empty()) bench::WriteResults(o.out, "streaming_bench", c10::Device(o.device), rows);
  return 0;
}

}  // namespace
}  // namespace qpool

int main(int argc, char** argv) { return qpool::Main(argc, argv); }
