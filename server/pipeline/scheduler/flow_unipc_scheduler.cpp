#include "pipeline/scheduler/flow_unipc_scheduler.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "util/log.h"

namespace qpool {
namespace {

double FlowAlpha(double s) { return 1.0 - s; }
double FlowSigma(double s) { return s; }

}  // namespace

Status FlowUniPcScheduler::SetTimesteps(int num_steps, int64_t image_seq_len) {
  RETURN_IF_ERROR(CheckSetTimesteps(num_steps, image_seq_len));
  const double exp_mu = std::exp(Mu(config_, image_seq_len));
  const double n = num_train_timesteps_;
  // The scheduler's own linspace(1, 1/N, n + 1)[:-1] (Note [Flow-matching UniPC]).
  const double last = 1.0 / n;
  const int points = num_steps + 1;
  sigmas_.clear();
  timesteps_.clear();
  for (int i = 0; i < num_steps; ++i) {
    // numpy's linspace: start + i * step (its last point, the stop, is left out).
    const double s = 1.0 + i * ((last - 1.0) / (points - 1));
    double shifted = Shifted(s, exp_mu);
    if (i == 0 && std::fabs(shifted - 1.0) < 1e-6) shifted -= 1e-6;
    timesteps_.push_back(std::trunc(shifted * n));
    sigmas_.push_back(static_cast<float>(shifted));
  }
  sigmas_.push_back(0.0);
  history_.Clear();
  next_step_ = 0;
  return Status::Ok();
}

double FlowUniPcScheduler::timestep(int step_index) const {
  TORCH_CHECK(step_index >= 0 && step_index < num_steps(), "step index ", step_index,
              " out of range [0, ", num_steps(), ")");
  return timesteps_[step_index] / num_train_timesteps_;
}

torch::Tensor FlowUniPcScheduler::Step(const torch::Tensor& velocity, int step_index,
                                       const torch::Tensor& sample) {
  TORCH_CHECK(step_index >= 0 && step_index < num_steps(), "step index ", step_index,
              " out of range [0, ", num_steps(), ")");
  TORCH_CHECK(step_index == 0 || step_index == next_step_, "unipc scheduler: step ", step_index,
              " after step ", next_step_ - 1, "; a multistep solver takes its steps in order");
  if (step_index == 0) history_.Clear();
  const auto type = sample.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const torch::Tensor x = sample.to(type);
  const torch::Tensor x0 = x - velocity.to(type) * sigmas_[step_index];
  next_step_ = step_index + 1;
  return UniPcStep(history_, sigmas_, UniPcSchedule{&FlowAlpha, &FlowSigma}, step_index,
                   num_steps(), x, x0)
      .to(sample.scalar_type());
}

StatusOr<std::unique_ptr<FlowSampler>> MakeFlowSampler(const std::string& name,
                                                       const FlowShiftConfig& config,
                                                       FlowSigmas sigmas, int num_train_timesteps) {
  if (name == "euler") {
    return std::unique_ptr<FlowSampler>(
        std::make_unique<FlowMatchEulerScheduler>(config, sigmas, num_train_timesteps));
  }
  if (name == "unipc") {
    return std::unique_ptr<FlowSampler>(
        std::make_unique<FlowUniPcScheduler>(config, sigmas, num_train_timesteps));
  }
  return InvalidArgument(
      StrCat("unknown flow-matching scheduler '", Abbreviate(name), "'; valid: euler, unipc"));
}

}  // namespace qpool
