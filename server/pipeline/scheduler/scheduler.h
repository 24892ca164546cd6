// Scheduler: the noise schedule and update rule of a diffusion denoising loop
// (diffusers-compatible).
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/scheduler_config.h"
#include "util/status.h"

namespace qpool {

// One denoising schedule. Usage per request:
//   ASSIGN_OR_RETURN(auto s, MakeScheduler("euler", config)); RETURN_IF_ERROR(s->SetTimesteps(30));
//   x = randn * s->init_noise_sigma();
//   for i in [0, num_steps): eps = unet(s->ScaleModelInput(x, i), s->timesteps()[i]);
//                            x = s->Step(eps, i, x);
// Scalar coefficients are computed in double; tensor math runs in the sample's dtype, upcast to
// float32 for half/bfloat16 samples (as diffusers does) and returned in the sample's dtype.
// Thread-safety: SetTimesteps and Step mutate (a multistep scheduler keeps the predictions of the
// steps it took: call Step for step indices 0, 1, ... in order); the const methods may run
// concurrently. A scheduler is cheap: make one per denoising loop.
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // One of SchedulerNames().
  virtual std::string name() const = 0;
  // Chooses the num_steps model timesteps; InvalidArgument if num_steps < 1 or
  // > num_train_timesteps (or, for DDIM, when steps_offset pushes a timestep out of range).
  virtual Status SetTimesteps(int num_steps) = 0;
  // Model timestep of each step, in order (the value passed to the UNet).
  const std::vector<double>& timesteps() const { return timesteps_; }
  // Steps chosen by the last successful SetTimesteps (0 before).
  int num_steps() const { return static_cast<int>(timesteps_.size()); }
  // Initial latents = randn * init_noise_sigma().
  virtual double init_noise_sigma() const = 0;
  // The UNet input for step `step_index` (throws c10::Error when the index is out of range).
  virtual torch::Tensor ScaleModelInput(const torch::Tensor& sample, int step_index) const = 0;
  // The previous (less noisy) sample from the model's prediction at `step_index`: epsilon, or v
  // with prediction_type v_prediction (throws c10::Error when the index is out of range, or for a
  // multistep scheduler when step_index is neither 0 nor the one after the last step taken).
  virtual torch::Tensor Step(const torch::Tensor& model_output, int step_index,
                             const torch::Tensor& sample) = 0;
  // The batch lost rows: keeps the state of rows `rows` (int64 indices into the batch, in order)
  // of what Step remembers. Schedulers without state ignore it.
  virtual void KeepRows(const torch::Tensor& rows) { (void)rows; }

  // Fresh noise of a step's sample shape, float32: the next draw of each image's own generator
  // (BatchRun::StepNoise), so that an image's noise is the same batched or alone.
  using NoiseSource = std::function<torch::Tensor()>;
  // Whether Step adds fresh noise (an ancestral sampler): it then needs a noise source.
  virtual bool stochastic() const { return false; }
  void set_noise_source(NoiseSource source) { noise_ = std::move(source); }

  // The validated config this scheduler was made with.
  const SchedulerConfig& config() const { return config_; }
  // cumprod(1 - beta) over the num_train_timesteps training steps.
  const std::vector<double>& alphas_cumprod() const { return alphas_cumprod_; }
  // sqrt((1 - a) / a) of each training step's alphas_cumprod a (the Euler and DPM-Solver sigma).
  const std::vector<double>& train_sigmas() const { return train_sigmas_; }

 protected:
  // `config` must have passed ValidateSchedulerConfig.
  explicit Scheduler(SchedulerConfig config);
  // InvalidArgument unless 1 <= num_steps <= num_train_timesteps.
  Status CheckNumSteps(int num_steps) const;
  // Throws c10::Error unless 0 <= step_index < num_steps().
  void CheckStepIndex(int step_index) const;

  SchedulerConfig config_;
  NoiseSource noise_;
  std::vector<double> alphas_cumprod_;
  std::vector<double> train_sigmas_;
  std::vector<double> timesteps_;
};

// Makes the scheduler `name` (one of SchedulerNames()); InvalidArgument listing the valid names for
// an unknown name, or naming the field of an invalid config.
StatusOr<std::unique_ptr<Scheduler>> MakeScheduler(const std::string& name,
                                                   const SchedulerConfig& config);
// The names MakeScheduler accepts: {"ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras",
// "dpmpp_2m_sde", "dpmpp_2m_sde_karras", "unipc", "unipc_karras"}.
const std::vector<std::string>& SchedulerNames();
// OK, or InvalidArgument naming the bad field: betas in (0,1) with beta_start < beta_end,
// known beta_schedule / timestep_spacing, prediction_type epsilon or v_prediction,
// num_train_timesteps >= 1,
// steps_offset >= 0.
Status ValidateSchedulerConfig(const SchedulerConfig& config);

// Helpers exposed for tests.
// The num_train_timesteps betas of config.beta_schedule (scaled_linear or linear).
std::vector<double> ComputeBetas(const SchedulerConfig& config);
// cumprod(1 - beta).
std::vector<double> AlphasCumprod(const std::vector<double>& betas);
// The num_steps timesteps of config.timestep_spacing, largest first, as diffusers computes
// them (Note [Timestep spacing] in scheduler.cpp). `round_linspace` rounds "linspace" values to
// integers (DDIM); Euler keeps them fractional. num_steps must be in [1, num_train_timesteps].
std::vector<double> SpacedTimesteps(const SchedulerConfig& config, int num_steps,
                                    bool round_linspace);

}  // namespace qpool
