// report.html of `qpool bench`: one self-contained page (inline CSS and SVG; no scripts, fonts
// or external references) with the headline numbers, latency over time with its p50 and p99,
// throughput over time, device memory over time, and tables by status code, device, pod, mix
// entry and memory series.
#pragma once

#include <string>

#include "bench_report.h"

namespace qpool::cli {

// The page for `results`.
std::string RenderHtml(const BenchResults& results);

}  // namespace qpool::cli
