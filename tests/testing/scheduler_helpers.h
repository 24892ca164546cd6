// Scheduler test helpers: the SD 1.x config, an independent reference of its sigmas, and
// schedulers made and set in one call (tests/unit/scheduler_test.cpp,
// multistep_scheduler_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/scheduler/scheduler.h"

namespace qpool {
namespace testing {

// SD 1.x: N = 1000, beta 0.00085 .. 0.012 scaled_linear, leading spacing, steps_offset 1.
inline SchedulerConfig Sd15() { return SchedulerConfig{}; }

inline SchedulerConfig WithSpacing(const std::string& spacing) {
  SchedulerConfig c;
  c.timestep_spacing = spacing;
  return c;
}

// Independent reference: beta_i = (sqrt(0.00085) + i * (sqrt(0.012) - sqrt(0.00085)) / 999)^2
// and alphas_cumprod[i] = prod_{j <= i} (1 - beta_j), by a plain loop.
inline double RefBeta(int i) {
  const double a = std::sqrt(0.00085), b = std::sqrt(0.012);
  const double s = a + i * (b - a) / 999.0;
  return s * s;
}
inline double RefAlphaCumprod(int i) {
  double p = 1.0;
  for (int j = 0; j <= i; ++j) p *= 1.0 - RefBeta(j);
  return p;
}
inline double RefSigma(int t) { return std::sqrt((1.0 - RefAlphaCumprod(t)) / RefAlphaCumprod(t)); }

inline std::unique_ptr<Scheduler> Make(const std::string& name, const SchedulerConfig& config,
                                       int steps) {
  auto s = MakeScheduler(name, config);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  const Status st = (*s)->SetTimesteps(steps);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return std::move(s).value();
}

// A float64 tensor of `v`.
inline torch::Tensor T(std::vector<double> v) {
  return torch::tensor(v, torch::dtype(torch::kFloat64));
}

}  // namespace testing
}  // namespace qpool
