// GPU timing shared by the Google Benchmark micro-benchmarks (quant_linear_bench,
// attention_bench, flux_ops_bench).
//
// Note [Benchmark methodology]: one sample is kCallsPerSample back-to-back calls on the current
// stream between two CUDA events, with no host synchronization in between; the sample's time
// divided by kCallsPerSample is one iteration's manual time (per call). A spin kernel
// (at::cuda::sleep) is queued before the start event so that the host has queued all calls
// before the GPU reaches them: the events then time GPU work, not the host's enqueue rate
// (host_us: host time per call to enqueue, reported separately). Baselines are measured the
// same way in the same process.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"

namespace qpool::bench {

constexpr int kCallsPerSample = 20;
constexpr int64_t kSleepCycles = 4'000'000;  // ~2 ms at 1.98 GHz: longer than 20 enqueues

// Marks `state` skipped and returns true when no CUDA device is available (every GPU
// benchmark's first line).
inline bool SkippedWithoutCuda(benchmark::State& state) {
  if (torch::cuda::is_available()) return false;
  state.SkipWithError("CUDA is not available");
  return true;
}

// Per-call microseconds of one sample: kCallsPerSample calls of `fn` between two events.
// `host_us` (optional) receives the host time per call spent enqueueing.
template <typename Fn>
double SampleMicros(Fn&& fn, at::cuda::CUDAEvent& start, at::cuda::CUDAEvent& stop,
                    double* host_us = nullptr) {
  auto stream = at::cuda::getCurrentCUDAStream();
  at::cuda::sleep(kSleepCycles);
  start.record(stream);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCallsPerSample; ++i) benchmark::DoNotOptimize(fn());
  const auto t1 = std::chrono::steady_clock::now();
  stop.record(stream);
  stop.synchronize();
  if (host_us != nullptr) {
    *host_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / kCallsPerSample;
  }
  return start.elapsed_time(stop) * 1e3 / kCallsPerSample;
}

// Median per-call microseconds of `samples` samples of `fn`, after three warm-up calls.
template <typename Fn>
double MedianMicros(Fn&& fn, int samples) {
  for (int i = 0; i < 3; ++i) fn();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  std::vector<double> t;
  for (int i = 0; i < samples; ++i) t.push_back(SampleMicros(fn, start, stop));
  return Median(t);
}

// The same with one sample per Google Benchmark iteration, each the iteration's manual time;
// `host_us` (optional) receives the median host time per call to enqueue.
template <typename Fn>
double MedianMicros(Fn&& fn, benchmark::State& state, double* host_us = nullptr) {
  for (int i = 0; i < 3; ++i) fn();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  std::vector<double> t, host;
  for (auto _ : state) {
    double h = 0;
    t.push_back(SampleMicros(fn, start, stop, &h));
    host.push_back(h);
    state.SetIterationTime(t.back() * 1e-6);
  }
  if (host_us != nullptr) *host_us = Median(host);
  return Median(t);
}

// Registers a benchmark timed by MedianMicros(fn, state): manual time in microseconds, one
// sample per iteration, `samples` iterations.
template <typename... Args>
void RegisterTimed(const std::string& name, int samples, Args&&... args) {
  benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(args)...)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(samples);
}

// The GPU's name and the CUDA runtime and driver versions in Google Benchmark's context (its
// JSON output's "context"), or device "none (CUDA not available)".
inline void AddDeviceContext() {
  if (!torch::cuda::is_available()) {
    benchmark::AddCustomContext("device", "none (CUDA not available)");
    return;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    benchmark::AddCustomContext("device", prop.name);
  }
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
}

// A micro-benchmark's main after its own flags: the torch version, Note [Benchmark
// methodology] for `samples` samples (with `baselines`, how the run's baselines were timed) and
// the device in the output's context, then `register_all` and Google Benchmark's run.
inline int RunGpuBenchmarks(int argc, char** argv, int samples, const std::string& baselines,
                            void (*register_all)()) {
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  benchmark::AddCustomContext(
      "methodology", "per call = median over " + std::to_string(samples) +
                         " samples of (CUDA-event time of " + std::to_string(kCallsPerSample) +
                         " back-to-back calls on the current stream, no host sync, queued behind "
                         "a ~2 ms spin kernel so GPU time is measured) / calls; " +
                         baselines);
  AddDeviceContext();
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace qpool::bench
