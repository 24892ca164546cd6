// EulerScheduler: Euler discrete sampling (Karras et al. Algorithm 2 without churn), as diffusers'
// EulerDiscreteScheduler.
#pragma once

#include <utility>

#include "pipeline/scheduler/scheduler.h"

namespace qpool {

// Euler in sigma space with epsilon prediction, linear sigma interpolation, no churn, no Karras
// sigmas. See Note [Euler sigmas].
class EulerScheduler : public Scheduler {
 public:
  // `config` must have passed ValidateSchedulerConfig (MakeScheduler does this).
  explicit EulerScheduler(SchedulerConfig config);

  std::string name() const override { return "euler"; }
  Status SetTimesteps(int num_steps) override;
  // max sigma for "linspace"/"trailing" spacing, sqrt(max_sigma^2 + 1) for "leading" (diffusers).
  double init_noise_sigma() const override { return init_noise_sigma_; }
  // sample / sqrt(sigma_i^2 + 1).
  torch::Tensor ScaleModelInput(const torch::Tensor& sample, int step_index) const override;
  // sample + model_output * (sigma_{i+1} - sigma_i).
  torch::Tensor Step(const torch::Tensor& model_output, int step_index,
                     const torch::Tensor& sample) override;

  // sigma of each step, followed by a final 0 (num_steps() + 1 values).
  const std::vector<double>& sigmas() const { return sigmas_; }

 private:
  std::vector<double> sigmas_;
  double init_noise_sigma_ = 1.0;
};

// Euler ancestral ("euler_a"), as diffusers' EulerAncestralDiscreteScheduler: Euler's timesteps,
// sigmas and input scaling; each step goes down to sigma_down and adds fresh noise of sigma_up
// (Note [Euler ancestral]). Needs a noise source (set_noise_source).
class EulerAncestralScheduler final : public EulerScheduler {
 public:
  explicit EulerAncestralScheduler(SchedulerConfig config) : EulerScheduler(std::move(config)) {}

  std::string name() const override { return "euler_a"; }
  bool stochastic() const override { return true; }
  // Throws c10::Error without a noise source, or when it gives noise of another shape.
  torch::Tensor Step(const torch::Tensor& model_output, int step_index,
                     const torch::Tensor& sample) override;
};

}  // namespace qpool
