// EncodePng's deflate search (Note [Run-length deflate]): zlib's run-length strategy against its
// string matching at levels 6 and 1, on three 1024x1024 RGB images made here: `noise` (uniform
// random bytes, what a random-weight pipeline decodes to), `smooth` (low-frequency waves with a
// little grain, like a generated image's skies and skin) and `textured` (a bilinear 32x32 grid
// of random colours with stronger grain), with the default threads and with one.
//
//   png_bench --benchmark_out=png.json --benchmark_out_format=json
//
// Counters: png_bytes (the file's size) and MBps (the image's raw bytes over the time).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "util/png_encoder.h"

namespace qpool {
namespace {

constexpr int kSide = 1024;

uint8_t Clamp(double v) {
  return static_cast<uint8_t>(std::lround(std::fmin(255., std::fmax(0., v))));
}

std::vector<uint8_t> MakeImage(int kind) {
  std::vector<uint8_t> px(static_cast<size_t>(kSide) * kSide * 3);
  std::mt19937 rng(1234);
  if (kind == 0) {
    for (auto& b : px) b = static_cast<uint8_t>(rng());
    return px;
  }
  std::normal_distribution<double> grain(0., kind == 1 ? 1.5 : 6.);
  std::uniform_real_distribution<double> colour(0., 255.);
  constexpr int kGrid = 33;  // textured: corners of 32x32 cells
  std::vector<double> grid(static_cast<size_t>(kGrid) * kGrid * 3);
  for (auto& g : grid) g = colour(rng);
  const double cell = static_cast<double>(kSide) / (kGrid - 1);
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      for (int c = 0; c < 3; ++c) {
        double v;
        if (kind == 1) {
          v = 128. + 60. * std::sin(x * 0.004 + c) + 40. * std::cos(y * 0.006 - 0.5 * c) +
              20. * std::sin((x + y) * 0.011);
        } else {
          const double gx = x / cell, gy = y / cell;
          const int x0 = static_cast<int>(gx), y0 = static_cast<int>(gy);
          const double fx = gx - x0, fy = gy - y0;
          auto at = [&](int yy, int xx) {
            return grid[(static_cast<size_t>(yy) * kGrid + xx) * 3 + c];
          };
          v = (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x0 + 1)) +
              fy * ((1 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1));
        }
        px[(static_cast<size_t>(y) * kSide + x) * 3 + c] = Clamp(v + grain(rng));
      }
    }
  }
  return px;
}

// Arguments: image (0 noise, 1 smooth, 2 textured), search (0 runs, 1 matches at 6, 2 matches
// at 1), threads (0: the default).
void BM_EncodePng(benchmark::State& state) {
  static const std::vector<std::vector<uint8_t>> images = {MakeImage(0), MakeImage(1),
                                                           MakeImage(2)};
  const auto& px = images[static_cast<size_t>(state.range(0))];
  PngOptions options;
  options.search = state.range(1) == 0 ? PngOptions::Search::kRuns : PngOptions::Search::kMatches;
  options.compression_level = state.range(1) == 2 ? 1 : 6;
  options.threads = static_cast<int>(state.range(2));
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string png = EncodePng(px.data(), kSide, kSide, options);
    if (png.empty()) state.SkipWithError("EncodePng failed");
    bytes = png.size();
    benchmark::DoNotOptimize(png.data());
  }
  static const char* kImages[] = {"noise", "smooth", "textured"};
  static const char* kSearch[] = {"runs", "matches_6", "matches_1"};
  state.SetLabel(std::string(kImages[state.range(0)]) + "/" + kSearch[state.range(1)] +
                 (state.range(2) == 1 ? "/1_thread" : "/default_threads"));
  state.counters["png_bytes"] = static_cast<double>(bytes);
  state.counters["MBps"] = benchmark::Counter(static_cast<double>(px.size()) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_EncodePng)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace qpool

BENCHMARK_MAIN();
