// DpmSolverScheduler: second-order multistep DPM-Solver++ ("DPM++ 2M") and its stochastic form
// ("DPM++ 2M SDE"), as diffusers' DPMSolverMultistepScheduler with its defaults (algorithm_type
// dpmsolver++ or sde-dpmsolver++), on the model's own timesteps or on Karras sigmas.
#pragma once

#include <utility>

#include "pipeline/scheduler/scheduler.h"
#include "pipeline/scheduler/unipc_core.h"

namespace qpool {

// DPM-Solver++ in data prediction, solver order 2 with the midpoint rule, first order on the
// first step and on the last (whose sigma is 0), no thresholding, epsilon or v prediction.
// Named "dpmpp_2m" (timesteps by config.timestep_spacing) and "dpmpp_2m_karras" (Karras et al.'s
// sigmas, rho = 7, between the training schedule's smallest and largest), and "dpmpp_2m_sde",
// "dpmpp_2m_sde_karras" for the stochastic form, which adds fresh noise each step (a noise
// source: set_noise_source). The step at index i combines the model's prediction there with the
// one of step i - 1: Step must see the steps of a denoising loop in order (Note [DPM-Solver++
// 2M]).
class DpmSolverScheduler : public Scheduler {
 public:
  // `config` must have passed ValidateSchedulerConfig (MakeScheduler does this).
  DpmSolverScheduler(SchedulerConfig config, bool karras, bool sde = false);

  std::string name() const override {
    return std::string(sde_ ? "dpmpp_2m_sde" : "dpmpp_2m") + (karras_ ? "_karras" : "");
  }
  bool stochastic() const override { return sde_; }
  // Integer timesteps (see Note [DPM-Solver++ 2M] for how they differ from DDIM's); forgets the
  // previous step's prediction. InvalidArgument when steps_offset pushes a timestep to
  // num_train_timesteps or beyond.
  Status SetTimesteps(int num_steps) override;
  double init_noise_sigma() const override { return 1.0; }
  // The sample itself: the solver works on the variance-preserving sample.
  torch::Tensor ScaleModelInput(const torch::Tensor& sample, int step_index) const override;
  // Throws c10::Error unless step_index is 0 or follows the last step taken, and for the SDE form
  // without a noise source or with noise of another shape.
  torch::Tensor Step(const torch::Tensor& model_output, int step_index,
                     const torch::Tensor& sample) override;
  void KeepRows(const torch::Tensor& rows) override;

  // sigma of each step, followed by a final 0 (num_steps() + 1 values, float32 as in diffusers).
  const std::vector<double>& sigmas() const { return sigmas_; }

 protected:
  // The data prediction x0 of the model's output at sigma `s` (Note [DPM-Solver++ 2M]).
  torch::Tensor DataPrediction(const torch::Tensor& out, const torch::Tensor& x, double s) const;

  bool karras_;
  bool sde_;
  torch::Tensor previous_x0_;  // the data prediction of the last step taken (float32 or wider)
  int next_step_ = 0;
  std::vector<double> sigmas_;
};

// UniPC ("unipc", "unipc_karras"), as diffusers' UniPCMultistepScheduler with its defaults
// (solver order 2, B(h) = e^-h - 1 ("bh2"), data prediction, the corrector on every step, first
// order on the first step and the last): DPM-Solver++'s timesteps and sigmas; each step first
// corrects the sample the model just saw with the model's new prediction (UniC), then predicts
// the next one (UniP). Note [UniPC].
class UniPcScheduler final : public DpmSolverScheduler {
 public:
  UniPcScheduler(SchedulerConfig config, bool karras)
      : DpmSolverScheduler(std::move(config), karras) {}

  std::string name() const override { return karras_ ? "unipc_karras" : "unipc"; }
  Status SetTimesteps(int num_steps) override;
  torch::Tensor Step(const torch::Tensor& model_output, int step_index,
                     const torch::Tensor& sample) override;
  void KeepRows(const torch::Tensor& rows) override;

 private:
  UniPcHistory history_;
};

}  // namespace qpool
