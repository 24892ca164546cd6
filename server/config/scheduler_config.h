// Noise-schedule settings shared by the manifest parser and the schedulers (SD 1.x defaults).
#pragma once

#include <string>

namespace qpool {

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
};

}  // namespace qpool
