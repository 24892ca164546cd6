#include "pipeline/scheduler/flow_match_scheduler.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <utility>

#include "util/log.h"

namespace qpool {

double FlowSampler::Shifted(double s, double exp_mu) const {
  if (config_.use_dynamic_shifting) return exp_mu / (exp_mu + (1.0 / s - 1.0));
  return config_.shift * s / (1.0 + (config_.shift - 1.0) * s);
}

double FlowSampler::Mu(const FlowShiftConfig& c, int64_t image_seq_len) {
  const double m = (c.max_shift - c.base_shift) /
                   static_cast<double>(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * c.base_image_seq_len;
  return static_cast<double>(image_seq_len) * m + b;
}

Status FlowSampler::CheckSetTimesteps(int num_steps, int64_t image_seq_len) {
  if (num_steps < 1) return InvalidArgument(StrCat("steps must be >= 1 (got ", num_steps, ")"));
  if (image_seq_len < 1) {
    return InvalidArgument(StrCat("image_seq_len must be >= 1 (got ", image_seq_len, ")"));
  }
  return Status::Ok();
}

double FlowSampler::timestep(int step_index) const {
  TORCH_CHECK(step_index >= 0 && step_index < num_steps(), "step index ", step_index,
              " out of range [0, ", num_steps(), ")");
  return sigmas_[step_index];
}

Status FlowMatchEulerScheduler::SetTimesteps(int num_steps, int64_t image_seq_len) {
  RETURN_IF_ERROR(CheckSetTimesteps(num_steps, image_seq_len));
  const double exp_mu = std::exp(Mu(config_, image_seq_len));
  sigmas_.clear();
  sigmas_.reserve(num_steps + 1);
  // FluxPipeline: np.linspace(1.0, 1 / n, n). The scheduler's own: from its training
  // schedule's first sigma (1, whatever the shift) to its last, 1 / num_train_timesteps, shifted
  // there by a static shift (diffusers keeps that float32 value).
  double first = 1.0, last = 1.0 / num_steps;
  if (spacing_ == FlowSigmas::kScheduler) {
    last = 1.0 / num_train_timesteps_;
    if (!config_.use_dynamic_shifting) last = static_cast<float>(Shifted(last, exp_mu));
  }
  for (int i = 0; i < num_steps; ++i) {
    const double s = num_steps == 1 ? first : first + (last - first) * i / (num_steps - 1);
    sigmas_.push_back(Shifted(s, exp_mu));
  }
  sigmas_.push_back(0.0);
  return Status::Ok();
}

torch::Tensor FlowMatchEulerScheduler::Step(const torch::Tensor& velocity, int step_index,
                                            const torch::Tensor& sample) {
  const double sigma = timestep(step_index);
  const double dt = sigmas_[step_index + 1] - sigma;
  return sample.to(torch::kFloat).add(velocity.to(torch::kFloat), dt).to(sample.scalar_type());
}

}  // namespace qpool
