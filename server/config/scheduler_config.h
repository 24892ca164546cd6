// Noise-schedule settings shared by the manifest parser and the schedulers (SD 1.x defaults).
#pragma once

#include <string>
#include <vector>

namespace qpool {

// The two families of noise schedules: DDPM's discrete betas (SD 1.x / 2.x, SDXL) and flow
// matching's sigmas in [0, 1] (FLUX).
enum class ScheduleFamily { kDdpm, kFlowMatch };

// The samplers a family runs; a request's scheduler must be one of them.
const std::vector<std::string>& SamplerNames(ScheduleFamily family);

// The resolution-dependent shift of a flow-matching schedule (diffusers'
// FlowMatchEulerDiscreteScheduler): with dynamic shifting, mu grows linearly in the image's token
// count from base_shift at base_image_seq_len to max_shift at max_image_seq_len and each sigma s
// becomes e^mu / (e^mu + 1/s - 1); without it, shift * s / (1 + (shift - 1) * s).
struct FlowShiftConfig {
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int base_image_seq_len = 256;
  int max_image_seq_len = 4096;
};

struct SchedulerConfig {
  int num_train_timesteps = 1000;
  double beta_start = 0.00085;
  double beta_end = 0.012;
  std::string beta_schedule = "scaled_linear";  // scaled_linear | linear
  std::string timestep_spacing = "leading";     // leading | linspace | trailing
  int steps_offset = 1;                         // SD 1.x's scheduler_config.json value
  // What the denoiser predicts: epsilon (the noise) or v_prediction (v = sqrt(a) eps -
  // sqrt(1 - a) x0, SD 2.x 768-v models).
  std::string prediction_type = "epsilon";
  // DDIM only (diffusers' DDIMScheduler; the other samplers read neither, as diffusers' do): the
  // step past the first training timestep ends on alpha 1 instead of alphas_cumprod[0], and the
  // predicted x0 is clamped to [-clip_sample_range, clip_sample_range] (Note [DDIM step]).
  bool set_alpha_to_one = false;
  bool clip_sample = false;
  double clip_sample_range = 1.0;
  // Flow-matching kinds only (ScheduleFamily::kFlowMatch); the fields above are DDPM's.
  FlowShiftConfig flow;
};

}  // namespace qpool
