// Helpers shared by the end-to-end C++ benchmarks (residency_bench, streaming_bench).
#pragma once

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace qpool::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Writes {"benchmark", "device" (the GPU's name, or "cpu"), "torch", "results": rows} to `path`;
// each row is a JSON object already.
inline void WriteResults(const std::string& path, const std::string& benchmark,
                         const c10::Device& device, const std::vector<std::string>& rows) {
  cudaDeviceProp prop{};
  if (!device.is_cuda() || cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess) {
    std::snprintf(prop.name, sizeof(prop.name), "%s", "cpu");
  }
  std::ofstream out(path);
  out << "{\"benchmark\": \"" << benchmark << "\", \"device\": \"" << prop.name
      << "\", \"torch\": \"" << TORCH_VERSION << "\", \"results\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) out << (i ? ",\n" : "") << rows[i];
  out << "\n]}\n";
}

}  // namespace qpool::bench
