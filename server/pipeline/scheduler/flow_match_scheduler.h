// FlowMatchEulerScheduler: the Euler sampler of flow-matching models (FLUX), as diffusers'
// FlowMatchEulerDiscreteScheduler with the sigmas FluxPipeline gives it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "config/scheduler_config.h"
#include "util/status.h"

namespace qpool {

// Note [Flow-matching Euler]
// The model predicts the velocity v = noise - x0 along x_s = (1 - s) x0 + s noise; sampling
// walks s from 1 to 0: x_next = x + (s_next - s) v. FluxPipeline asks for n sigmas
// linspace(1, 1/n, n), which the schedule then shifts (FlowShiftConfig: resolution-dependent
// with use_dynamic_shifting, mu from the image's token count), and appends 0. The denoiser gets
// s itself as its timestep (FluxPipeline passes timesteps / 1000 = s). Sigmas are computed in
// double (diffusers: float32; differences ~1e-7); the step runs in float32 and returns the
// sample's dtype, as diffusers does.
//
// A pipeline that asks for no sigmas (HiDreamImagePipeline) gets the scheduler's own
// (FlowSigmas::kScheduler): linspace(sigma_max, sigma_min, n) over the training schedule's
// sigmas (1 down to 1/num_train_timesteps, shifted when the shift is static), then shifted again
// as above. Its denoiser gets sigma * num_train_timesteps (the scheduler's timesteps).
//
// Thread-safety: SetTimesteps mutates; the const methods may run concurrently. Cheap: make one
// per request.
enum class FlowSigmas { kFluxPipeline, kScheduler };

class FlowMatchEulerScheduler {
 public:
  explicit FlowMatchEulerScheduler(FlowShiftConfig config,
                                   FlowSigmas sigmas = FlowSigmas::kFluxPipeline,
                                   int num_train_timesteps = 1000);

  // Chooses `num_steps` sigmas for an image of `image_seq_len` latent tokens; InvalidArgument
  // unless num_steps >= 1 and image_seq_len >= 1.
  Status SetTimesteps(int num_steps, int64_t image_seq_len);
  // The num_steps + 1 sigmas, from about 1 down to the final 0.
  const std::vector<double>& sigmas() const { return sigmas_; }
  int num_steps() const { return static_cast<int>(sigmas_.size()) - 1; }
  // The denoiser's timestep at `step_index`: its sigma.
  double timestep(int step_index) const;
  // x + (sigma_next - sigma) * velocity (throws c10::Error when the index is out of range).
  torch::Tensor Step(const torch::Tensor& velocity, int step_index,
                     const torch::Tensor& sample) const;

  // The shift exponent for `image_seq_len` tokens (diffusers' calculate_shift).
  static double Mu(const FlowShiftConfig& config, int64_t image_seq_len);

 private:
  // The shift of sigma s in (0, 1]: by exp(mu) with dynamic shifting, else by config_.shift.
  double Shifted(double s, double exp_mu) const;

  FlowShiftConfig config_;
  FlowSigmas spacing_;
  int num_train_timesteps_;
  std::vector<double> sigmas_;
};

}  // namespace qpool
