// Offload/onload bandwidth of one component (the UNet by default) under the `model` policy,
// measured side by side with a plain cudaMemcpy of the same bytes from pinned host memory.
//
//   residency_bench --repository /models --pipelines sd15,sd15-nf4 [--component unet]
//                   [--device cuda:0] [--reps 20] [--out residency.json]
//
// Each pipeline is loaded with its offload policy forced to `model`, so it rests in pinned host
// copies. One repetition times, in this order: onload (Use: allocate the device block, one copy,
// rebind and verify every tensor, until the copy is done), offload (Done: drop the device copy),
// and the baseline copy. The whole pipeline's admin Onload/Offload are timed too. Medians are
// reported; the ratio is ours over the baseline's bandwidth.
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
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
  std::string component = "unet";
  std::string device = "cuda:0";
  int reps = 20;
  std::string out;
};

void Sync() {
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize");
}

// One pipeline's measurements, as a JSON object.
std::string Measure(const Options& options, const std::string& name, ArenaAllocator& arenas,
                    BlockCopier& copier, DeviceMemory& memory) {
  const c10::Device device(options.device);
  torch::empty({1}, torch::TensorOptions().device(device));  // allocator stats need a first use
  const auto kinds = PipelineKinds::Builtin();
  auto repository = ModelRepository::Open(options.repository, kinds->Catalog());
  if (!repository.ok()) throw std::runtime_error(repository.status().ToString());
  auto manifest = repository->LoadManifest(name);
  if (!manifest.ok()) throw std::runtime_error(manifest.status().ToString());
  manifest->offload.mode = OffloadMode::kModel;
  auto loaded = kinds->Load(*manifest, device, c10::kHalf,
                            ResidencyContext{&arenas, &copier, &memory, nullptr});
  if (!loaded.ok()) throw std::runtime_error(loaded.status().ToString());
  Pipeline& pipeline = **loaded;
  PipelineResidency& residency = pipeline.residency();
  Component* component = nullptr;
  for (const auto& c : pipeline.components()) {
    if (c->name() == options.component) component = c.get();
  }
  if (component == nullptr) throw std::runtime_error("no component " + options.component);
  uint64_t bytes = 0;
  for (const auto& place : residency.Snapshot()) {
    if (place.name == options.component) bytes = place.host_bytes;
  }

  // The baseline: the same number of bytes, pinned, into a device buffer allocated once.
  void* host = nullptr;
  void* dev = nullptr;
  if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess ||
      cudaMalloc(&dev, bytes) != cudaSuccess) {
    throw std::runtime_error("baseline buffers");
  }
  std::memset(host, 1, bytes);

  std::vector<double> onload, offload, memcpy_s, pipeline_on, pipeline_off;
  uint64_t pipeline_bytes = 0;
  for (int rep = 0; rep <= options.reps; ++rep) {  // rep 0 warms up and is not counted
    Sync();
    auto t = Clock::now();
    residency.BeginRequest();
    Status used = residency.Use(*component);
    if (!used.ok()) throw std::runtime_error(used.ToString());
    Sync();
    const double on = SecondsSince(t);
    t = Clock::now();
    residency.Done(*component);
    Sync();
    const double off = SecondsSince(t);
    residency.Settle();

    t = Clock::now();
    if (cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
    const double base = SecondsSince(t);

    t = Clock::now();
    auto on_all = residency.Onload(device);
    if (!on_all.ok()) throw std::runtime_error(on_all.status().ToString());
    Sync();
    const double all_on = SecondsSince(t);
    t = Clock::now();
    auto off_all = residency.Offload();
    if (!off_all.ok()) throw std::runtime_error(off_all.status().ToString());
    Sync();
    const double all_off = SecondsSince(t);
    if (rep == 0) continue;
    onload.push_back(on);
    offload.push_back(off);
    memcpy_s.push_back(base);
    pipeline_on.push_back(all_on);
    pipeline_off.push_back(all_off);
    pipeline_bytes = on_all->bytes;
  }
  cudaFree(dev);
  cudaFreeHost(host);

  const double on = Median(onload), base = Median(memcpy_s);
  const double gbps = static_cast<double>(bytes) / on / 1e9;
  const double base_gbps = static_cast<double>(bytes) / base / 1e9;
  const double all_gbps = static_cast<double>(pipeline_bytes) / Median(pipeline_on) / 1e9;
  char line[512];
  std::snprintf(line, sizeof(line),
                "%-12s %-6s %8.1f MiB  onload %7.2f ms %6.1f GB/s  offload %6.3f ms  "
                "cudaMemcpy %7.2f ms %6.1f GB/s  ratio %.3f  | pipeline %8.1f MiB onload %6.1f "
                "GB/s offload %.3f ms",
                name.c_str(), options.component.c_str(), bytes / 1048576.0, on * 1e3, gbps,
                Median(offload) * 1e3, base * 1e3, base_gbps, gbps / base_gbps,
                pipeline_bytes / 1048576.0, all_gbps, Median(pipeline_off) * 1e3);
  std::cout << line << std::endl;
  std::ostringstream json;
  json << "{\"pipeline\": \"" << name << "\", \"component\": \"" << options.component
       << "\", \"bytes\": " << bytes << ", \"reps\": " << options.reps
       << ", \"onload_median_seconds\": " << on << ", \"onload_gbps\": " << gbps
       << ", \"offload_median_seconds\": " << Median(offload)
       << ", \"cudamemcpy_median_seconds\": " << base << ", \"cudamemcpy_gbps\": " << base_gbps
       << ", \"onload_vs_cudamemcpy\": " << gbps / base_gbps
       << ", \"pipeline_bytes\": " << pipeline_bytes
       << ", \"pipeline_onload_median_seconds\": " << Median(pipeline_on)
       << ", \"pipeline_onload_gbps\": " << all_gbps
       << ", \"pipeline_offload_median_seconds\": " << Median(pipeline_off) << "}";
  return json.str();
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--repository")
      options.repository = value;
    else if (flag == "--pipelines")
      options.pipelines = Split(value);
    else if (flag == "--component")
      options.component = value;
    else if (flag == "--device")
      options.device = value;
    else if (flag == "--reps")
      options.reps = std::stoi(value);
    else if (flag == "--out")
      options.out = value;
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (options.repository.empty() || options.pipelines.empty()) {
    std::cerr << "usage: residency_bench --repository DIR --pipelines a,b [--component unet] "
                 "[--device cuda:0] [--reps 20] [--out FILE]\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "residency_bench needs a CUDA device\n";
    return 1;
  }
  ArenaAllocator arenas;
  BlockCopier copier;
  DeviceMemory memory(arenas);
  std::vector<std::string> rows;
  try {
    for (const auto& name : options.pipelines) {
      rows.push_back(Measure(options, name, arenas, copier, memory));
    }
  } catch (const std::exception& e) {
    std::cerr << "residency_bench: " << e.what() << "\n";
    return 1;
  }
  if (!options.out.empty()) {
    bench::WriteResults(options.out, "residency_bench", c10::Device(options.device), rows);
  }
  return 0;
}

}  // namespace
}  // namespace qpool

int main(int argc, char** argv) { return qpool::Main(argc, argv); }
