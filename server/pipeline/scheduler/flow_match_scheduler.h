// FlowMatchEulerScheduler: the Euler sampler of flow-matching models (FLUX), as diffusers'
// FlowMatchEulerDiscreteScheduler with the sigmas FluxPipeline gives it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
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

// A sampler of flow-matching models: "euler" (FlowMatchEulerScheduler) or "unipc"
// (FlowUniPcScheduler, flow_unipc_scheduler.h, which also makes them by name).
class FlowSampler {
 public:
  FlowSampler(FlowShiftConfig config, FlowSigmas spacing, int num_train_timesteps)
      : config_(std::move(config)), spacing_(spacing), num_train_timesteps_(num_train_timesteps) {}
  virtual ~FlowSampler() = default;

  virtual std::string name() const = 0;
  // Chooses `num_steps` sigmas for an image of `image_seq_len` latent tokens and forgets any
  // earlier steps; InvalidArgument unless num_steps >= 1 and image_seq_len >= 1.
  virtual Status SetTimesteps(int num_steps, int64_t image_seq_len) = 0;
  // The num_steps + 1 sigmas, from about 1 down to the final 0.
  const std::vector<double>& sigmas() const { return sigmas_; }
  int num_steps() const { return static_cast<int>(sigmas_.size()) - 1; }
  // The denoiser's timestep at `step_index` in sigma units (the pipeline scales it); throws
  // c10::Error when the index is out of range.
  virtual double timestep(int step_index) const;
  // The sample of step `step_index + 1` from the model's velocity at step `step_index`, in the
  // sample's dtype.
  virtual torch::Tensor Step(const torch::Tensor& velocity, int step_index,
                             const torch::Tensor& sample) = 0;
  // Keeps the rows `rows` of whatever earlier steps left (a batch's cancelled requests dropped).
  virtual void KeepRows(const torch::Tensor& rows) { (void)rows; }

  // The shift exponent for `image_seq_len` tokens (diffusers' calculate_shift).
  static double Mu(const FlowShiftConfig& config, int64_t image_seq_len);

 protected:
  // The shift of sigma s in (0, 1]: by exp(mu) with dynamic shifting, else by config_.shift.
  double Shifted(double s, double exp_mu) const;
  // InvalidArgument unless num_steps >= 1 and image_seq_len >= 1.
  static Status CheckSetTimesteps(int num_steps, int64_t image_seq_len);

  FlowShiftConfig config_;
  FlowSigmas spacing_;
  int num_train_timesteps_;
  std::vector<double> sigmas_;
};

class FlowMatchEulerScheduler final : public FlowSampler {
 public:
  explicit FlowMatchEulerScheduler(FlowShiftConfig config,
                                   FlowSigmas sigmas = FlowSigmas::kFluxPipeline,
                                   int num_train_timesteps = 1000)
      : FlowSampler(std::move(config), sigmas, num_train_timesteps) {}

  std::string name() const override { return "euler"; }
  Status SetTimesteps(int num_steps, int64_t image_seq_len) override;
  // x + (sigma_next - sigma) * velocity (throws c10::Error when the index is out of range).
  torch::Tensor Step(const torch::Tensor& velocity, int step_index,
                     const torch::Tensor& sample) override;
};

}  // namespace qpool
