#include "pipeline/scheduler/dpm_solver_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/log.h"

namespace qpool {

// Note [DPM-Solver++ 2M]
// With sigma = sqrt((1 - a) / a) on the training grid, the variance-preserving sample is
// x = alpha * (x0 + sigma * eps), alpha = 1 / sqrt(sigma^2 + 1), and the solver's log-SNR is
// lambda = -log(sigma). Each step turns the model's output into a data prediction,
//   x0 = (x - alpha * sigma * eps) / alpha   (epsilon)   or   alpha * x - alpha * sigma * v (v),
// and moves from sigma_s to sigma_t (h = lambda_t - lambda_s, so e^-h = sigma_t / sigma_s):
//   first order:  x_t = (alpha_t sigma_t / (alpha_s sigma_s)) x - alpha_t (e^-h - 1) D
// with D = x0; the second order (midpoint) uses the previous step's prediction x0' at sigma_s' too:
//   r = (lambda_s - lambda_s') / h,  D = x0 + (x0 - x0') / (2 r).
// The first step has no x0' and runs first order; the last step goes to sigma 0, where the
// first-order update is x0 itself (diffusers' final_sigmas_type "zero", which runs the last step
// in first order whatever lower_order_final says). The SDE form (sde-dpmsolver++) keeps e^-h of
// the sample, takes 1 - e^-2h of D and adds fresh noise:
//   x_t = (alpha_t sigma_t / (alpha_s sigma_s)) e^-h x + alpha_t (1 - e^-2h) D
//         + alpha_t sigma_t sqrt(1 - e^-2h) noise,
// again x0 itself at sigma 0; the noise is drawn on every step, the last one too, as diffusers
// draws it.
// Timesteps (diffusers' set_timesteps for this scheduler, which differ from DDIM's):
//   linspace: round(linspace(0, N - 1, n + 1)) largest first, without the last (0);
//   leading:  (n..1) * (N / (n + 1)) (integer division) + steps_offset;
//   trailing: as Note [Timestep spacing];
// and each sigma is the training sigma at its timestep. Karras: sigma_i = (s_max^(1/7) +
// i / (n - 1) (s_min^(1/7) - s_max^(1/7)))^7 between the smallest and the largest training
// sigma, and its timestep is log-sigma's position on the training grid, interpolated linearly
// and rounded (half to even, as np.round). diffusers stores sigmas in float32: so do we, and
// computes the coefficients in float32: we use double (differences ~1e-7 relative). A half or
// bfloat16 sample is updated in float32 and returned in its dtype; the previous prediction is
// kept in float32.

namespace {

torch::ScalarType ComputeType(const torch::Tensor& t) {
  const auto type = t.scalar_type();
  return (type == torch::kHalf || type == torch::kBFloat16) ? torch::kFloat : type;
}

double AsFloat(double x) { return static_cast<double>(static_cast<float>(x)); }

// diffusers' _sigma_to_t: where log(sigma) lies on the increasing grid log_sigmas, as a
// fractional index.
double SigmaToT(double sigma, const std::vector<double>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  const auto n = static_cast<int64_t>(log_sigmas.size());
  int64_t low = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (log_sigma - log_sigmas[i] >= 0) low = i;
  }
  low = std::min(low, n - 2);
  const double lo = log_sigmas[low];
  const double hi = log_sigmas[low + 1];
  const double w = std::clamp((lo - log_sigma) / (lo - hi), 0.0, 1.0);
  return (1.0 - w) * static_cast<double>(low) + w * static_cast<double>(low + 1);
}

}  // namespace

DpmSolverScheduler::DpmSolverScheduler(SchedulerConfig config, bool karras, bool sde)
    : Scheduler(std::move(config)), karras_(karras), sde_(sde) {}

Status DpmSolverScheduler::SetTimesteps(int num_steps) {
  RETURN_IF_ERROR(CheckNumSteps(num_steps));
  const int n_train = config_.num_train_timesteps;

  std::vector<double> timesteps;
  std::vector<double> sigmas;
  if (karras_) {
    std::vector<double> log_sigmas;
    log_sigmas.reserve(train_sigmas_.size());
    for (double s : train_sigmas_) log_sigmas.push_back(std::log(s));
    const double rho = 7.0;
    const double min_inv = std::pow(train_sigmas_.front(), 1.0 / rho);
    const double max_inv = std::pow(train_sigmas_.back(), 1.0 / rho);
    for (int i = 0; i < num_steps; ++i) {
      const double ramp = num_steps == 1 ? 0.0 : static_cast<double>(i) / (num_steps - 1);
      const double sigma = std::pow(max_inv + ramp * (min_inv - max_inv), rho);
      sigmas.push_back(AsFloat(sigma));
      timesteps.push_back(std::nearbyint(SigmaToT(sigma, log_sigmas)));
    }
  } else {
    if (config_.timestep_spacing == "linspace") {
      const double step = static_cast<double>(n_train - 1) / num_steps;
      for (int i = num_steps; i >= 1; --i) {
        timesteps.push_back(std::nearbyint(i == num_steps ? n_train - 1.0 : i * step));
      }
    } else if (config_.timestep_spacing == "leading") {
      const int ratio = n_train / (num_steps + 1);
      for (int i = num_steps; i >= 1; --i) {
        timesteps.push_back(static_cast<double>(i) * ratio + config_.steps_offset);
      }
    } else {
      timesteps = SpacedTimesteps(config_, num_steps, /*round_linspace=*/true);
    }
    for (double t : timesteps) {
      if (t < 0 || t >= n_train) {
        return InvalidArgument(StrCat(name(), " scheduler: ", num_steps, " steps with ",
                                      config_.timestep_spacing, " spacing and steps_offset ",
                                      config_.steps_offset, " reach timestep ", t, ", outside [0, ",
                                      n_train, ")"));
      }
      sigmas.push_back(AsFloat(train_sigmas_[static_cast<size_t>(t)]));
    }
  }
  sigmas.push_back(0.0);
  timesteps_ = std::move(timesteps);
  sigmas_ = std::move(sigmas);
  previous_x0_ = torch::Tensor();
  next_step_ = 0;
  return Status::Ok();
}

torch::Tensor DpmSolverScheduler::ScaleModelInput(const torch::Tensor& sample,
                                                  int step_index) const {
  CheckStepIndex(step_index);
  return sample;
}

torch::Tensor DpmSolverScheduler::Step(const torch::Tensor& model_output, int step_index,
                                       const torch::Tensor& sample) {
  CheckStepIndex(step_index);
  TORCH_CHECK(step_index == 0 || step_index == next_step_, name(), " scheduler: step ", step_index,
              " after step ", next_step_ - 1, "; a multistep solver takes its steps in order");
  TORCH_CHECK(!sde_ || noise_, name(), " scheduler: no noise source (set_noise_source)");
  if (step_index == 0) previous_x0_ = torch::Tensor();
  const auto type = ComputeType(sample);
  const double s = sigmas_[step_index];
  const double t = sigmas_[step_index + 1];
  const double alpha_s = 1.0 / std::sqrt(s * s + 1.0);
  const torch::Tensor x = sample.to(type);
  torch::Tensor x0 = DataPrediction(model_output.to(type), x, s);
  torch::Tensor noise;
  if (sde_) {
    noise = noise_();
    TORCH_CHECK(noise.sizes() == sample.sizes(), name(), " scheduler: noise of shape ",
                noise.sizes(), " for a sample of shape ", sample.sizes());
  }
  torch::Tensor prev;
  if (t == 0.0) {
    prev = x0;
  } else {
    const double alpha_t = 1.0 / std::sqrt(t * t + 1.0);
    const double decay = t / s;  // e^-h
    double c_sample = (alpha_t * t) / (alpha_s * s);
    double c_data = -alpha_t * (decay - 1.0);
    if (sde_) {
      c_sample *= decay;
      c_data = alpha_t * (1.0 - decay * decay);
    }
    torch::Tensor d = x0;
    const double s_prev = step_index > 0 ? sigmas_[step_index - 1] : 0.0;
    if (previous_x0_.defined() && s_prev != s && s != t) {  // equal sigmas: no slope to use
      const double r = std::log(s_prev / s) / std::log(s / t);
      d = x0 + (x0 - previous_x0_.to(type)) * (0.5 / r);
    }
    prev = x.mul(c_sample).add_(d, c_data);
    if (sde_) {
      prev.add_(noise.to(prev.device(), type), alpha_t * t * std::sqrt(1.0 - decay * decay));
    }
  }
  previous_x0_ = x0;
  next_step_ = step_index + 1;
  return prev.to(sample.scalar_type());
}

torch::Tensor DpmSolverScheduler::DataPrediction(const torch::Tensor& out, const torch::Tensor& x,
                                                 double s) const {
  const double alpha_s = 1.0 / std::sqrt(s * s + 1.0);
  return config_.prediction_type == "v_prediction" ? x.mul(alpha_s).sub_(out, alpha_s * s)
                                                   : x.sub(out, alpha_s * s).div_(alpha_s);
}

void DpmSolverScheduler::KeepRows(const torch::Tensor& rows) {
  if (previous_x0_.defined()) {
    previous_x0_ = previous_x0_.index_select(0, rows.to(previous_x0_.device()));
  }
}

namespace {

// Note [UniPC] (unipc_core.h) on the variance-preserving sample: lambda = -log(sigma).
double VpAlpha(double g) { return 1.0 / std::sqrt(g * g + 1.0); }
double VpSigma(double g) { return g * VpAlpha(g); }

}  // namespace

Status UniPcScheduler::SetTimesteps(int num_steps) {
  RETURN_IF_ERROR(DpmSolverScheduler::SetTimesteps(num_steps));
  history_.Clear();
  return Status::Ok();
}

torch::Tensor UniPcScheduler::Step(const torch::Tensor& model_output, int step_index,
                                   const torch::Tensor& sample) {
  CheckStepIndex(step_index);
  TORCH_CHECK(step_index == 0 || step_index == next_step_, name(), " scheduler: step ", step_index,
              " after step ", next_step_ - 1, "; a multistep solver takes its steps in order");
  if (step_index == 0) history_.Clear();
  const auto type = ComputeType(sample);
  const torch::Tensor x = sample.to(type);
  const torch::Tensor x0 = DataPrediction(model_output.to(type), x, sigmas_[step_index]);
  next_step_ = step_index + 1;
  return UniPcStep(history_, sigmas_, UniPcSchedule{&VpAlpha, &VpSigma}, step_index, num_steps(), x,
                   x0)
      .to(sample.scalar_type());
}

void UniPcScheduler::KeepRows(const torch::Tensor& rows) { history_.KeepRows(rows); }

}  // namespace qpool
