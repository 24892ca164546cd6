#include "pipeline/scheduler/euler_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/log.h"

namespace qpool {

// Note [Euler sigmas]
// sigma(t) = sqrt((1 - alphas_cumprod[t]) / alphas_cumprod[t]) on the training grid t = 0..N-1;
// a step's sigma is that curve interpolated linearly at its (possibly fractional, see
// Note [Timestep spacing]) timestep, clamped at the ends like np.interp. A 0 is appended for the
// end of the last step. The sampler works on x = x0 + sigma * eps: the UNet, trained on
// sqrt(a) x0 + sqrt(1 - a) eps, gets x / sqrt(sigma^2 + 1), and one Euler step moves along
// d = eps: x_next = x + eps * (sigma_next - sigma). diffusers keeps these sigmas in float32; we
// keep double (differences ~1e-7 relative).
// With v_prediction, x0 = x / (sigma^2 + 1) - v * sigma / sqrt(sigma^2 + 1) and the step moves
// along d = (x - x0) / sigma: x_next = x * (1 + dt * sigma / (sigma^2 + 1)) + v * dt /
// sqrt(sigma^2 + 1), with dt = sigma_next - sigma.

namespace {

torch::ScalarType ComputeType(const torch::Tensor& t) {
  const auto type = t.scalar_type();
  return (type == torch::kHalf || type == torch::kBFloat16) ? torch::kFloat : type;
}

// np.interp(x, arange(len(ys)), ys).
double Interp(double x, const std::vector<double>& ys) {
  if (x <= 0) return ys.front();
  const double last = static_cast<double>(ys.size() - 1);
  if (x >= last) return ys.back();
  const auto lo = static_cast<size_t>(std::floor(x));
  const double frac = x - static_cast<double>(lo);
  return ys[lo] + frac * (ys[lo + 1] - ys[lo]);
}

}  // namespace

EulerScheduler::EulerScheduler(SchedulerConfig config) : Scheduler(std::move(config)) {}

Status EulerScheduler::SetTimesteps(int num_steps) {
  RETURN_IF_ERROR(CheckNumSteps(num_steps));
  timesteps_ = SpacedTimesteps(config_, num_steps, /*round_linspace=*/false);
  sigmas_.clear();
  sigmas_.reserve(timesteps_.size() + 1);
  for (double t : timesteps_) sigmas_.push_back(Interp(t, train_sigmas_));
  sigmas_.push_back(0.0);
  const double max_sigma = *std::max_element(sigmas_.begin(), sigmas_.end());
  init_noise_sigma_ =
      config_.timestep_spacing == "leading" ? std::sqrt(max_sigma * max_sigma + 1.0) : max_sigma;
  return Status::Ok();
}

torch::Tensor EulerScheduler::ScaleModelInput(const torch::Tensor& sample, int step_index) const {
  CheckStepIndex(step_index);
  const double sigma = sigmas_[step_index];
  const auto type = ComputeType(sample);
  return sample.to(type).div(std::sqrt(sigma * sigma + 1.0)).to(sample.scalar_type());
}

torch::Tensor EulerScheduler::Step(const torch::Tensor& model_output, int step_index,
                                   const torch::Tensor& sample) {
  CheckStepIndex(step_index);
  const double sigma = sigmas_[step_index];
  const double dt = sigmas_[step_index + 1] - sigma;
  const auto type = ComputeType(sample);
  if (config_.prediction_type == "v_prediction") {
    const double s2 = sigma * sigma + 1.0;
    torch::Tensor prev =
        sample.to(type).mul(1.0 + dt * sigma / s2).add_(model_output.to(type), dt / std::sqrt(s2));
    return prev.to(sample.scalar_type());
  }
  torch::Tensor prev = sample.to(type).add(model_output.to(type), dt);
  return prev.to(sample.scalar_type());
}

// Note [Euler ancestral]
// From sigma to sigma_next, an ancestral step splits the way down into a deterministic part and
// fresh noise: sigma_up = sqrt(sigma_next^2 (sigma^2 - sigma_next^2) / sigma^2) and sigma_down =
// sqrt(sigma_next^2 - sigma_up^2). With x0 = x - sigma * eps (epsilon) or x / (sigma^2 + 1) -
// v * sigma / sqrt(sigma^2 + 1) (v), x_next = x + (x - x0) / sigma * (sigma_down - sigma) +
// noise * sigma_up. The last step (sigma_next = 0) adds no noise but, as diffusers, still draws
// it: the draws of an image's generator stay in step with diffusers' for the same generator.
torch::Tensor EulerAncestralScheduler::Step(const torch::Tensor& model_output, int step_index,
                                            const torch::Tensor& sample) {
  CheckStepIndex(step_index);
  TORCH_CHECK(noise_, name(), " scheduler: no noise source (set_noise_source)");
  const double sigma = sigmas()[step_index];
  const double next = sigmas()[step_index + 1];
  const double up = std::sqrt(next * next * (sigma * sigma - next * next) / (sigma * sigma));
  const double down = std::sqrt(std::max(next * next - up * up, 0.0));
  const auto type = ComputeType(sample);
  const torch::Tensor x = sample.to(type);
  const torch::Tensor out = model_output.to(type);
  torch::Tensor x0;
  if (config_.prediction_type == "v_prediction") {
    const double s2 = sigma * sigma + 1.0;
    x0 = x.div(s2).sub_(out, sigma / std::sqrt(s2));
  } else {
    x0 = x.sub(out, sigma);
  }
  torch::Tensor prev = x.add((x - x0).div_(sigma), down - sigma);
  const torch::Tensor noise = noise_();
  TORCH_CHECK(noise.sizes() == sample.sizes(), name(), " scheduler: noise of shape ", noise.sizes(),
              " for a sample of shape ", sample.sizes());
  prev.add_(noise.to(prev.device(), type), up);
  return prev.to(sample.scalar_type());
}

}  // namespace qpool
