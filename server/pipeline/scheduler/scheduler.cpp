#include "pipeline/scheduler/scheduler.h"

#include <cmath>
#include <utility>

#include "pipeline/scheduler/ddim_scheduler.h"
#include "pipeline/scheduler/dpm_solver_scheduler.h"
#include "pipeline/scheduler/euler_scheduler.h"
#include "util/log.h"

namespace qpool {

// Note [Timestep spacing]
// With N = num_train_timesteps and n = num_steps, diffusers picks (largest first):
//   leading:  step_ratio = N / n (integer division); t_i = i * step_ratio + steps_offset.
//   linspace: linspace(0, N - 1, n); DDIM rounds half to even (np.round), Euler keeps the
//             fractional values, stored as float32 by diffusers, so we round them to float too:
//             the UNet sees exactly diffusers' timestep and Euler interpolates its sigma there.
//   trailing: round(arange(N, 0, -N / n)) - 1. We take exactly n values N - k * N / n,
//             k = 0..n-1; np.arange can yield one extra value when N / n is inexact
//             (e.g. N = 1000, n = 3), which diffusers would then carry as a stray timestep -1.
// steps_offset applies to "leading" only, as in diffusers.

namespace {

std::vector<double> Linspace(double start, double stop, int num) {
  std::vector<double> out(static_cast<size_t>(num));
  if (num == 1) {
    out[0] = start;
    return out;
  }
  const double step = (stop - start) / (num - 1);
  for (int i = 0; i < num; ++i) out[i] = start + i * step;
  out[num - 1] = stop;  // numpy pins the end point
  return out;
}

bool OneOf(const std::string& value, const std::vector<std::string>& valid) {
  for (const auto& v : valid) {
    if (v == value) return true;
  }
  return false;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::vector<double> ComputeBetas(const SchedulerConfig& config) {
  const int n = config.num_train_timesteps;
  if (config.beta_schedule == "linear") return Linspace(config.beta_start, config.beta_end, n);
  std::vector<double> betas = Linspace(std::sqrt(config.beta_start), std::sqrt(config.beta_end), n);
  for (double& b : betas) b *= b;
  return betas;
}

std::vector<double> AlphasCumprod(const std::vector<double>& betas) {
  std::vector<double> out;
  out.reserve(betas.size());
  double prod = 1.0;
  for (double b : betas) {
    prod *= 1.0 - b;
    out.push_back(prod);
  }
  return out;
}

std::vector<double> SpacedTimesteps(const SchedulerConfig& config, int num_steps,
                                    bool round_linspace) {
  const int n_train = config.num_train_timesteps;
  std::vector<double> out;
  out.reserve(static_cast<size_t>(num_steps));
  if (config.timestep_spacing == "linspace") {
    const std::vector<double> t = Linspace(0.0, n_train - 1, num_steps);
    for (auto it = t.rbegin(); it != t.rend(); ++it) {
      out.push_back(round_linspace ? std::nearbyint(*it)
                                   : static_cast<double>(static_cast<float>(*it)));
    }
  } else if (config.timestep_spacing == "trailing") {
    const double ratio = static_cast<double>(n_train) / num_steps;
    for (int k = 0; k < num_steps; ++k) out.push_back(std::nearbyint(n_train - k * ratio) - 1.0);
  } else {  // leading
    const int ratio = n_train / num_steps;
    for (int i = num_steps - 1; i >= 0; --i) {
      out.push_back(static_cast<double>(i) * ratio + config.steps_offset);
    }
  }
  return out;
}

Status ValidateSchedulerConfig(const SchedulerConfig& c) {
  static const std::vector<std::string> kSchedules = {"scaled_linear", "linear"};
  static const std::vector<std::string> kSpacings = {"leading", "linspace", "trailing"};
  if (c.num_train_timesteps < 1) {
    return InvalidArgument(
        StrCat("scheduler num_train_timesteps must be >= 1, got ", c.num_train_timesteps));
  }
  if (!(c.beta_start > 0.0 && c.beta_start < 1.0)) {
    return InvalidArgument(StrCat("scheduler beta_start must be in (0, 1), got ", c.beta_start));
  }
  if (!(c.beta_end > 0.0 && c.beta_end < 1.0)) {
    return InvalidArgument(StrCat("scheduler beta_end must be in (0, 1), got ", c.beta_end));
  }
  if (!(c.beta_start < c.beta_end)) {
    return InvalidArgument(StrCat("scheduler beta_start (", c.beta_start,
                                  ") must be less than beta_end (", c.beta_end, ")"));
  }
  if (!OneOf(c.beta_schedule, kSchedules)) {
    return InvalidArgument(StrCat("scheduler beta_schedule '", c.beta_schedule,
                                  "' is not supported; valid: ", Join(kSchedules)));
  }
  if (!OneOf(c.timestep_spacing, kSpacings)) {
    return InvalidArgument(StrCat("scheduler timestep_spacing '", c.timestep_spacing,
                                  "' is not supported; valid: ", Join(kSpacings)));
  }
  if (c.steps_offset < 0) {
    return InvalidArgument(StrCat("scheduler steps_offset must be >= 0, got ", c.steps_offset));
  }
  if (c.prediction_type != "epsilon" && c.prediction_type != "v_prediction") {
    return InvalidArgument(StrCat("scheduler prediction_type '", c.prediction_type,
                                  "' is not supported; valid: epsilon, v_prediction"));
  }
  return Status::Ok();
}

const std::vector<std::string>& SchedulerNames() { return SamplerNames(ScheduleFamily::kDdpm); }

StatusOr<std::unique_ptr<Scheduler>> MakeScheduler(const std::string& name,
                                                   const SchedulerConfig& config) {
  if (!OneOf(name, SchedulerNames())) {
    return InvalidArgument(
        StrCat("unknown scheduler '", Abbreviate(name), "'; valid: ", Join(SchedulerNames())));
  }
  RETURN_IF_ERROR(ValidateSchedulerConfig(config));
  if (name == "ddim") return std::unique_ptr<Scheduler>(std::make_unique<DdimScheduler>(config));
  if (name == "euler_a") {
    return std::unique_ptr<Scheduler>(std::make_unique<EulerAncestralScheduler>(config));
  }
  if (name == "unipc" || name == "unipc_karras") {
    return std::unique_ptr<Scheduler>(
        std::make_unique<UniPcScheduler>(config, name == "unipc_karras"));
  }
  if (name.rfind("dpmpp_2m", 0) == 0) {
    const bool karras = name.size() > 7 && name.compare(name.size() - 7, 7, "_karras") == 0;
    return std::unique_ptr<Scheduler>(std::make_unique<DpmSolverScheduler>(
        config, karras, name.find("_sde") != std::string::npos));
  }
  return std::unique_ptr<Scheduler>(std::make_unique<EulerScheduler>(config));
}

Scheduler::Scheduler(SchedulerConfig config)
    : config_(std::move(config)), alphas_cumprod_(AlphasCumprod(ComputeBetas(config_))) {
  train_sigmas_.reserve(alphas_cumprod_.size());
  for (double a : alphas_cumprod_) train_sigmas_.push_back(std::sqrt((1.0 - a) / a));
}

Status Scheduler::CheckNumSteps(int num_steps) const {
  if (num_steps < 1 || num_steps > config_.num_train_timesteps) {
    return InvalidArgument(StrCat(name(), " scheduler: steps must be between 1 and ",
                                  config_.num_train_timesteps, ", got ", num_steps));
  }
  return Status::Ok();
}

void Scheduler::CheckStepIndex(int step_index) const {
  TORCH_CHECK(step_index >= 0 && step_index < num_steps(), name(), " scheduler: step_index ",
              step_index, " is outside [0, ", num_steps(), ") (was SetTimesteps called?)");
}

}  // namespace qpool
