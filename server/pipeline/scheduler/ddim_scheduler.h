// DdimScheduler: deterministic DDIM (eta = 0), as diffusers' DDIMScheduler with SD 1.x settings.
#pragma once

#include <utility>

#include "pipeline/scheduler/scheduler.h"

namespace qpool {

// DDIM with eta = 0, epsilon or v prediction, and diffusers' set_alpha_to_one (the step past the
// first training timestep ends on alpha 1, else on alphas_cumprod[0]) and clip_sample (x0
// clamped) from the config. See Note [DDIM step].
class DdimScheduler : public Scheduler {
 public:
  // `config` must have passed ValidateSchedulerConfig (MakeScheduler does this).
  explicit DdimScheduler(SchedulerConfig config);

  std::string name() const override { return "ddim"; }
  // Integer timesteps of config.timestep_spacing; also rejects steps_offset pushing a
  // timestep to >= num_train_timesteps (e.g. 1000 "leading" steps with offset 1).
  Status SetTimesteps(int num_steps) override;
  double init_noise_sigma() const override { return 1.0; }
  // DDIM feeds the sample unscaled: returns `sample` itself.
  torch::Tensor ScaleModelInput(const torch::Tensor& sample, int step_index) const override;
  torch::Tensor Step(const torch::Tensor& model_output, int step_index,
                     const torch::Tensor& sample) override;

  // The two coefficients of Step at `step_index`: x_prev = c_sample * x + c_out * output, the
  // model's output being eps or v (Note [DDIM step]); without clip_sample.
  std::pair<double, double> StepCoefficients(int step_index) const;

 private:
  // alphas_cumprod at the timestep before timesteps_[step_index], and at it.
  std::pair<double, double> Alphas(int step_index) const;

  int step_ratio_ = 0;  // num_train_timesteps / num_steps (integer division, as diffusers)
};

}  // namespace qpool
