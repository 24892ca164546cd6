#include "pipeline/scheduler/ddim_scheduler.h"

#include <cmath>
#include <utility>

#include "util/log.h"

namespace qpool {

// Note [DDIM step]
// With a_t = alphas_cumprod[t] and a_prev = alphas_cumprod[t - N / n] (alphas_cumprod[0] once
// that index is negative), diffusers computes
//   x0     = (x - sqrt(1 - a_t) * eps) / sqrt(a_t)
//   x_prev = sqrt(a_prev) * x0 + sqrt(1 - a_prev) * eps.
// Expanding x0 gives x_prev = c_sample * x + c_eps * eps with
//   c_sample = sqrt(a_prev / a_t),  c_eps = sqrt(1 - a_prev) - sqrt(a_prev) * sqrt(1 - a_t) /
//   sqrt(a_t),
// two scalars computed in double, so the tensor work is one multiply-add in the sample's dtype.
// The previous timestep is t - N / n for every spacing, exactly as diffusers does, even where
// "linspace"/"trailing" spacing makes it differ from the next timestep in the list.
// With v_prediction the model predicts v, so x0 = sqrt(a_t) x - sqrt(1 - a_t) v and
// eps = sqrt(a_t) v + sqrt(1 - a_t) x; the same expansion gives
//   c_sample = sqrt(a_prev) sqrt(a_t) + sqrt(1 - a_prev) sqrt(1 - a_t),
//   c_v      = sqrt(1 - a_prev) sqrt(a_t) - sqrt(a_prev) sqrt(1 - a_t).
// set_alpha_to_one makes a_prev 1 where its index is negative. clip_sample clamps x0 before the
// second line (eps is not re-derived, as diffusers' default use_clipped_model_output=False), so
// that step computes x0 and eps apart, each a linear combination of x and the output.

namespace {

torch::ScalarType ComputeType(const torch::Tensor& t) {
  const auto type = t.scalar_type();
  return (type == torch::kHalf || type == torch::kBFloat16) ? torch::kFloat : type;
}

}  // namespace

DdimScheduler::DdimScheduler(SchedulerConfig config) : Scheduler(std::move(config)) {}

Status DdimScheduler::SetTimesteps(int num_steps) {
  RETURN_IF_ERROR(CheckNumSteps(num_steps));
  std::vector<double> t = SpacedTimesteps(config_, num_steps, /*round_linspace=*/true);
  for (double v : t) {
    if (v < 0 || v >= config_.num_train_timesteps) {
      return InvalidArgument(StrCat("ddim scheduler: ", num_steps, " ", config_.timestep_spacing,
                                    " steps with steps_offset ", config_.steps_offset,
                                    " give timestep ", v, ", outside [0, ",
                                    config_.num_train_timesteps, "); use fewer steps"));
    }
  }
  timesteps_ = std::move(t);
  step_ratio_ = config_.num_train_timesteps / num_steps;
  return Status::Ok();
}

torch::Tensor DdimScheduler::ScaleModelInput(const torch::Tensor& sample, int step_index) const {
  CheckStepIndex(step_index);
  return sample;
}

std::pair<double, double> DdimScheduler::Alphas(int step_index) const {
  CheckStepIndex(step_index);
  const int t = static_cast<int>(timesteps_[step_index]);
  const int prev = t - step_ratio_;
  const double last = config_.set_alpha_to_one ? 1.0 : alphas_cumprod_[0];
  return {prev >= 0 ? alphas_cumprod_[prev] : last, alphas_cumprod_[t]};
}

std::pair<double, double> DdimScheduler::StepCoefficients(int step_index) const {
  const auto [a_prev, a_t] = Alphas(step_index);
  if (config_.prediction_type == "v_prediction") {
    return {std::sqrt(a_prev) * std::sqrt(a_t) + std::sqrt(1.0 - a_prev) * std::sqrt(1.0 - a_t),
            std::sqrt(1.0 - a_prev) * std::sqrt(a_t) - std::sqrt(a_prev) * std::sqrt(1.0 - a_t)};
  }
  const double c_sample = std::sqrt(a_prev / a_t);
  const double c_eps =
      std::sqrt(1.0 - a_prev) - std::sqrt(a_prev) * std::sqrt(1.0 - a_t) / std::sqrt(a_t);
  return {c_sample, c_eps};
}

torch::Tensor DdimScheduler::Step(const torch::Tensor& model_output, int step_index,
                                  const torch::Tensor& sample) {
  const auto type = ComputeType(sample);
  torch::Tensor x = sample.to(type);
  if (config_.clip_sample) {
    const auto [a_prev, a_t] = Alphas(step_index);
    const double r = config_.clip_sample_range;
    const torch::Tensor out = model_output.to(type);
    const bool v = config_.prediction_type == "v_prediction";
    torch::Tensor x0 = v ? x.mul(std::sqrt(a_t)).add_(out, -std::sqrt(1.0 - a_t))
                         : x.div(std::sqrt(a_t)).add_(out, -std::sqrt(1.0 - a_t) / std::sqrt(a_t));
    const torch::Tensor eps = v ? out.mul(std::sqrt(a_t)).add_(x, std::sqrt(1.0 - a_t)) : out;
    return x0.clamp_(-r, r)
        .mul_(std::sqrt(a_prev))
        .add_(eps, std::sqrt(1.0 - a_prev))
        .to(sample.scalar_type());
  }
  const auto [c_sample, c_eps] = StepCoefficients(step_index);
  torch::Tensor prev = x.mul(c_sample).add_(model_output.to(type), c_eps);
  return prev.to(sample.scalar_type());
}

}  // namespace qpool
