// DDIM, Euler and DPM-Solver++ 2M schedulers against values computed by hand (SD 1.x config
// unless stated).
#include "pipeline/scheduler/scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "pipeline/scheduler/ddim_scheduler.h"
#include "pipeline/scheduler/dpm_solver_scheduler.h"
#include "pipeline/scheduler/euler_scheduler.h"
#include "pipeline/scheduler/flow_match_scheduler.h"

namespace qpool {
namespace {

// SD 1.x: N = 1000, beta 0.00085 .. 0.012 scaled_linear, leading spacing, steps_offset 1.
SchedulerConfig Sd15() { return SchedulerConfig{}; }

SchedulerConfig WithSpacing(const std::string& spacing) {
  SchedulerConfig c;
  c.timestep_spacing = spacing;
  return c;
}

// Independent reference: beta_i = (sqrt(0.00085) + i * (sqrt(0.012) - sqrt(0.00085)) / 999)^2
// and alphas_cumprod[i] = prod_{j <= i} (1 - beta_j), by a plain loop.
double RefBeta(int i) {
  const double a = std::sqrt(0.00085), b = std::sqrt(0.012);
  const double s = a + i * (b - a) / 999.0;
  return s * s;
}
double RefAlphaCumprod(int i) {
  double p = 1.0;
  for (int j = 0; j <= i; ++j) p *= 1.0 - RefBeta(j);
  return p;
}
double RefSigma(int t) { return std::sqrt((1.0 - RefAlphaCumprod(t)) / RefAlphaCumprod(t)); }

std::unique_ptr<Scheduler> Make(const std::string& name, const SchedulerConfig& config, int steps) {
  auto s = MakeScheduler(name, config);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  const Status st = (*s)->SetTimesteps(steps);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return std::move(s).value();
}

torch::Tensor T(std::vector<double> v) { return torch::tensor(v, torch::dtype(torch::kFloat64)); }

TEST(SchedulerBetas, ScaledLinearEndpointsAndCumprod) {
  const std::vector<double> betas = ComputeBetas(Sd15());
  ASSERT_EQ(betas.size(), 1000u);
  EXPECT_NEAR(betas[0], 0.00085, 1e-15);  // sqrt(0.00085)^2
  EXPECT_NEAR(betas[999], 0.012, 1e-15);  // sqrt(0.012)^2
  // betas[1] = (0.0291547595 + (0.1095445115 - 0.0291547595) / 999)^2 = 0.0292352292^2
  //          = 0.000854699
  EXPECT_NEAR(betas[1], 0.000854699, 1e-9);
  EXPECT_NEAR(betas[500], RefBeta(500), 1e-15);

  const std::vector<double> ac = AlphasCumprod(betas);
  ASSERT_EQ(ac.size(), 1000u);
  EXPECT_NEAR(ac[0], 0.99915, 1e-15);                     // 1 - 0.00085
  EXPECT_NEAR(ac[1], 0.99915 * (1 - 0.000854699), 1e-9);  // = 0.998296
  EXPECT_NEAR(ac[500], RefAlphaCumprod(500), 1e-12);      // ~0.27633
  EXPECT_NEAR(ac[500], 0.27633, 1e-5);
  // Published SD value: alphas_cumprod[999] ~ 0.0047 (sigma_max 14.6146 = sqrt((1-a)/a)).
  EXPECT_NEAR(ac[999], RefAlphaCumprod(999), 1e-12);
  EXPECT_NEAR(ac[999], 0.0046601, 1e-7);
}

TEST(SchedulerBetas, Linear) {
  SchedulerConfig c;
  c.beta_schedule = "linear";
  c.beta_start = 0.0001;
  c.beta_end = 0.02;
  const std::vector<double> betas = ComputeBetas(c);
  EXPECT_DOUBLE_EQ(betas[0], 0.0001);
  EXPECT_DOUBLE_EQ(betas[999], 0.02);
  EXPECT_NEAR(betas[1], 0.0001 + 0.0199 / 999, 1e-16);  // 0.00011992
}

TEST(SchedulerTimesteps, SpacingRules) {
  // leading: 1000 / 10 = 100 -> 900, 800, ..., 0, + steps_offset 1.
  EXPECT_EQ(SpacedTimesteps(Sd15(), 10, true),
            (std::vector<double>{901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
  // linspace(0, 999, 7) = 0, 166.5, 333, 499.5, 666, 832.5, 999; np.round is half-to-even:
  // 166.5 -> 166, 499.5 -> 500, 832.5 -> 832.
  EXPECT_EQ(SpacedTimesteps(WithSpacing("linspace"), 7, true),
            (std::vector<double>{999, 832, 666, 500, 333, 166, 0}));
  // Euler keeps the fractional values.
  EXPECT_EQ(SpacedTimesteps(WithSpacing("linspace"), 7, false),
            (std::vector<double>{999, 832.5, 666, 499.5, 333, 166.5, 0}));
  // trailing: arange(1000, 0, -100) - 1.
  EXPECT_EQ(SpacedTimesteps(WithSpacing("trailing"), 10, true),
            (std::vector<double>{999, 899, 799, 699, 599, 499, 399, 299, 199, 99}));
  // trailing, 3 steps: 1000, 666.67, 333.33 -> rounded 1000, 667, 333 -> minus 1.
  EXPECT_EQ(SpacedTimesteps(WithSpacing("trailing"), 3, true),
            (std::vector<double>{999, 666, 332}));
}

TEST(DdimScheduler, TimestepsLeadingWithOffset) {
  auto s = Make("ddim", Sd15(), 10);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->name(), "ddim");
  EXPECT_EQ(s->num_steps(), 10);
  EXPECT_EQ(s->timesteps(), (std::vector<double>{901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
  EXPECT_EQ(s->init_noise_sigma(), 1.0);

  ASSERT_TRUE(s->SetTimesteps(50).ok());
  ASSERT_EQ(s->num_steps(), 50);
  // 1000 / 50 = 20: 980 + 1, 960 + 1, ..., 0 + 1.
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s->timesteps()[i], 981 - 20 * i) << i;
}

TEST(DdimScheduler, OneStepByHand) {
  auto s = Make("ddim", Sd15(), 10);
  ASSERT_NE(s, nullptr);
  // Step 0: t = 901, prev = 901 - 100 = 801.
  const double a_t = RefAlphaCumprod(901), a_p = RefAlphaCumprod(801);
  const torch::Tensor x = T({1.0, -2.0, 0.5}), eps = T({0.5, 0.25, -1.0});
  const torch::Tensor out = s->Step(eps, 0, x);
  for (int i = 0; i < 3; ++i) {
    const double xi = x[i].item<double>(), ei = eps[i].item<double>();
    const double x0 = (xi - std::sqrt(1 - a_t) * ei) / std::sqrt(a_t);
    const double expected = std::sqrt(a_p) * x0 + std::sqrt(1 - a_p) * ei;
    EXPECT_NEAR(out[i].item<double>(), expected, 1e-12) << i;
  }
  // Last step: t = 1, prev = -99 < 0 -> a_prev = alphas_cumprod[0] = 0.99915 (set_alpha_to_one
  // false). x0 = (1 - sqrt(1-a_1) * 0.5) / sqrt(a_1); x_prev = sqrt(0.99915) x0 + sqrt(0.00085)
  // 0.5.
  const double a_1 = RefAlphaCumprod(1);
  const double x0 = (1.0 - std::sqrt(1 - a_1) * 0.5) / std::sqrt(a_1);
  const double expected = std::sqrt(0.99915) * x0 + std::sqrt(0.00085) * 0.5;
  EXPECT_NEAR(s->Step(T({0.5}), 9, T({1.0}))[0].item<double>(), expected, 1e-12);
  // ScaleModelInput is the identity.
  EXPECT_TRUE(torch::equal(s->ScaleModelInput(x, 3), x));
}

TEST(EulerScheduler, LinspaceTimestepsSigmasAndInitSigma) {
  auto s = Make("euler", WithSpacing("linspace"), 10);
  ASSERT_NE(s, nullptr);
  auto* euler = dynamic_cast<EulerScheduler*>(s.get());
  ASSERT_NE(euler, nullptr);
  // linspace(0, 999, 10) = 0, 111, ..., 999 (exact integers), reversed.
  EXPECT_EQ(s->timesteps(), (std::vector<double>{999, 888, 777, 666, 555, 444, 333, 222, 111, 0}));
  ASSERT_EQ(euler->sigmas().size(), 11u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(euler->sigmas()[i], RefSigma(static_cast<int>(s->timesteps()[i])), 1e-9) << i;
  }
  EXPECT_EQ(euler->sigmas()[10], 0.0);
  // sigma(999) = sqrt(0.99534 / 0.0046601) = 14.6146 (k-diffusion's SD sigma_max); sigma(0) =
  // sqrt(0.00085 / 0.99915) = 0.029167 (sigma_min). linspace -> init_noise_sigma = max sigma.
  EXPECT_NEAR(euler->sigmas()[0], 14.6146, 1e-4);
  EXPECT_NEAR(euler->sigmas()[9], 0.029167, 1e-6);
  EXPECT_NEAR(s->init_noise_sigma(), 14.6146, 1e-4);
}

TEST(EulerScheduler, LeadingInitSigmaAndFractionalInterpolation) {
  auto s = Make("euler", Sd15(), 10);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->timesteps(), (std::vector<double>{901, 801, 701, 601, 501, 401, 301, 201, 101, 1}));
  // leading -> sqrt(sigma(901)^2 + 1) = sqrt(8.39068^2 + 1) = 8.45006.
  EXPECT_NEAR(s->init_noise_sigma(), std::sqrt(RefSigma(901) * RefSigma(901) + 1), 1e-9);
  EXPECT_NEAR(s->init_noise_sigma(), 8.45006, 1e-5);

  // linspace, 7 steps: timestep 832.5 -> sigma halfway between sigma(832) and sigma(833).
  auto f = Make("euler", WithSpacing("linspace"), 7);
  ASSERT_NE(f, nullptr);
  auto* euler = dynamic_cast<EulerScheduler*>(f.get());
  EXPECT_EQ(f->timesteps()[1], 832.5);
  EXPECT_NEAR(euler->sigmas()[1], 0.5 * (RefSigma(832) + RefSigma(833)), 1e-9);
  // 50 steps: t_1 = 999 - 999/49 = 978.6122..., stored as float32 like diffusers.
  ASSERT_TRUE(f->SetTimesteps(50).ok());
  EXPECT_EQ(f->timesteps()[1], static_cast<double>(static_cast<float>(999.0 - 999.0 / 49)));
  const double t1 = f->timesteps()[1];
  EXPECT_NEAR(euler->sigmas()[1], RefSigma(978) + (t1 - 978) * (RefSigma(979) - RefSigma(978)),
              1e-9);
}

TEST(EulerScheduler, OneStepAndInputScalingByHand) {
  auto s = Make("euler", WithSpacing("linspace"), 10);
  ASSERT_NE(s, nullptr);
  const double s0 = RefSigma(999), s1 = RefSigma(888);
  const torch::Tensor x = T({1.0, -2.0}), eps = T({0.5, 0.25});
  // x / sqrt(s0^2 + 1)
  const torch::Tensor in = s->ScaleModelInput(x, 0);
  EXPECT_NEAR(in[0].item<double>(), 1.0 / std::sqrt(s0 * s0 + 1), 1e-9);
  EXPECT_NEAR(in[1].item<double>(), -2.0 / std::sqrt(s0 * s0 + 1), 1e-9);
  // x + eps * (s1 - s0)
  const torch::Tensor out = s->Step(eps, 0, x);
  EXPECT_NEAR(out[0].item<double>(), 1.0 + 0.5 * (s1 - s0), 1e-9);
  EXPECT_NEAR(out[1].item<double>(), -2.0 + 0.25 * (s1 - s0), 1e-9);
  // Last step goes to sigma 0: x + eps * (0 - sigma(0)).
  EXPECT_NEAR(s->Step(T({2.0}), 9, T({1.0}))[0].item<double>(), 1.0 - 2.0 * RefSigma(0), 1e-9);
}

// A perfect epsilon oracle (model_output = the true noise) must walk the sample back to x0.
TEST(SchedulerDenoise, DdimWithOracleRecoversX0) {
  for (int steps : {10, 50}) {
    auto s = Make("ddim", Sd15(), steps);
    ASSERT_NE(s, nullptr);
    torch::manual_seed(0);
    const torch::Tensor x0 = torch::randn({2, 4, 8, 8}, torch::kFloat64).clamp(-1, 1);
    const torch::Tensor noise = torch::randn({2, 4, 8, 8}, torch::kFloat64);
    const double a_T = s->alphas_cumprod()[static_cast<int>(s->timesteps()[0])];
    torch::Tensor x = std::sqrt(a_T) * x0 + std::sqrt(1 - a_T) * noise;
    for (int i = 0; i < s->num_steps(); ++i) x = s->Step(noise, i, s->ScaleModelInput(x, i));
    // The last step lands on alphas_cumprod[0]: x = sqrt(0.99915) x0 + sqrt(0.00085) noise.
    const torch::Tensor expected = std::sqrt(0.99915) * x0 + std::sqrt(0.00085) * noise;
    EXPECT_LT((x - expected).abs().max().item<double>(), 1e-10);
    EXPECT_LT((x - x0).abs().max().item<double>(), 0.03 * noise.abs().max().item<double>() + 1e-3);
  }
}

TEST(SchedulerDenoise, EulerWithOracleRecoversX0) {
  for (const char* spacing : {"linspace", "leading", "trailing"}) {
    auto s = Make("euler", WithSpacing(spacing), 25);
    ASSERT_NE(s, nullptr);
    auto* euler = dynamic_cast<EulerScheduler*>(s.get());
    torch::manual_seed(1);
    const torch::Tensor x0 = torch::randn({1, 4, 8, 8}, torch::kFloat64);
    const torch::Tensor noise = torch::randn({1, 4, 8, 8}, torch::kFloat64);
    torch::Tensor x = x0 + euler->sigmas()[0] * noise;  // x = x0 + sigma * eps
    for (int i = 0; i < s->num_steps(); ++i) x = s->Step(noise, i, x);
    EXPECT_LT((x - x0).abs().max().item<double>(), 1e-9) << spacing;
  }
  // float32 latents stay float32 and still land on x0.
  auto s = Make("euler", WithSpacing("linspace"), 30);
  auto* euler = dynamic_cast<EulerScheduler*>(s.get());
  torch::manual_seed(2);
  const torch::Tensor x0 = torch::randn({1, 4, 8, 8});
  const torch::Tensor noise = torch::randn({1, 4, 8, 8});
  torch::Tensor x = x0 + s->init_noise_sigma() * noise;  // linspace: init sigma = sigmas[0]
  EXPECT_DOUBLE_EQ(s->init_noise_sigma(), euler->sigmas()[0]);
  for (int i = 0; i < s->num_steps(); ++i) x = s->Step(noise, i, x);
  EXPECT_EQ(x.scalar_type(), torch::kFloat);
  EXPECT_LT((x - x0).abs().max().item<double>(), 1e-4);
}

// A perfect v oracle (v = sqrt(a) eps - sqrt(1 - a) x0, diffusers' get_velocity) walks back to x0
// as the epsilon oracle does, for both schedulers.
TEST(SchedulerDenoise, VPredictionWithOracleRecoversX0) {
  SchedulerConfig v = Sd15();
  v.prediction_type = "v_prediction";
  torch::manual_seed(3);
  const torch::Tensor x0 = torch::randn({1, 4, 8, 8}, torch::kFloat64).clamp(-1, 1);
  const torch::Tensor noise = torch::randn({1, 4, 8, 8}, torch::kFloat64);

  auto ddim = Make("ddim", v, 20);
  ASSERT_NE(ddim, nullptr);
  const double a_T = ddim->alphas_cumprod()[static_cast<int>(ddim->timesteps()[0])];
  torch::Tensor x = std::sqrt(a_T) * x0 + std::sqrt(1 - a_T) * noise;
  for (int i = 0; i < ddim->num_steps(); ++i) {
    const double a = ddim->alphas_cumprod()[static_cast<int>(ddim->timesteps()[i])];
    x = ddim->Step(std::sqrt(a) * noise - std::sqrt(1 - a) * x0, i, x);
  }
  const torch::Tensor expected = std::sqrt(0.99915) * x0 + std::sqrt(0.00085) * noise;
  EXPECT_LT((x - expected).abs().max().item<double>(), 1e-10);

  for (const char* spacing : {"leading", "trailing"}) {
    v.timestep_spacing = spacing;
    auto s = Make("euler", v, 25);
    ASSERT_NE(s, nullptr);
    auto* euler = dynamic_cast<EulerScheduler*>(s.get());
    torch::Tensor y = x0 + euler->sigmas()[0] * noise;
    for (int i = 0; i < s->num_steps(); ++i) {
      const double sigma = euler->sigmas()[i];
      const double a = 1.0 / (sigma * sigma + 1.0);
      y = s->Step(std::sqrt(a) * noise - std::sqrt(1 - a) * x0, i, y);
    }
    EXPECT_LT((y - x0).abs().max().item<double>(), 1e-9) << spacing;
  }
}

// Note [DPM-Solver++ 2M]: n + 1 points of linspace (DDIM takes n), and leading's ratio
// N / (n + 1).
TEST(DpmSolverScheduler, TimestepsAndSigmas) {
  auto lin = Make("dpmpp_2m", WithSpacing("linspace"), 10);
  ASSERT_NE(lin, nullptr);
  // round(i * 99.9), i = 10..1; 499.5 rounds half to even.
  EXPECT_EQ(lin->timesteps(),
            (std::vector<double>{999, 899, 799, 699, 599, 500, 400, 300, 200, 100}));
  auto* dpm = dynamic_cast<DpmSolverScheduler*>(lin.get());
  ASSERT_NE(dpm, nullptr);
  ASSERT_EQ(dpm->sigmas().size(), 11u);
  for (int i = 0; i < 10; ++i) {
    const double want = RefSigma(static_cast<int>(lin->timesteps()[i]));
    EXPECT_NEAR(dpm->sigmas()[i], want, 1e-6 * want) << i;
    EXPECT_EQ(dpm->sigmas()[i], static_cast<double>(static_cast<float>(dpm->sigmas()[i])));
  }
  EXPECT_EQ(dpm->sigmas().back(), 0.0);
  EXPECT_EQ(lin->init_noise_sigma(), 1.0);

  auto leading = Make("dpmpp_2m", Sd15(), 10);  // ratio 1000 / 11 = 90, offset 1
  ASSERT_NE(leading, nullptr);
  EXPECT_EQ(leading->timesteps(),
            (std::vector<double>{901, 811, 721, 631, 541, 451, 361, 271, 181, 91}));
  auto trailing = Make("dpmpp_2m", WithSpacing("trailing"), 4);
  ASSERT_NE(trailing, nullptr);
  EXPECT_EQ(trailing->timesteps(), (std::vector<double>{999, 749, 499, 249}));
}

// Karras et al.'s rho = 7 ramp from the largest to the smallest training sigma; each timestep is
// its sigma's place on the training grid, rounded.
TEST(DpmSolverScheduler, KarrasSigmasAndTimesteps) {
  const int n = 12;
  auto s = Make("dpmpp_2m_karras", Sd15(), n);
  ASSERT_NE(s, nullptr);
  auto* dpm = dynamic_cast<DpmSolverScheduler*>(s.get());
  ASSERT_NE(dpm, nullptr);
  const double lo = std::pow(RefSigma(0), 1.0 / 7), hi = std::pow(RefSigma(999), 1.0 / 7);
  for (int i = 0; i < n; ++i) {
    const double want = std::pow(hi + i / (n - 1.0) * (lo - hi), 7);
    EXPECT_NEAR(dpm->sigmas()[i], want, 1e-6 * want) << i;
    // The timestep's training sigma brackets the step's sigma within one grid step.
    const int t = static_cast<int>(s->timesteps()[i]);
    ASSERT_GE(t, 0);
    ASSERT_LE(t, 999);
    if (t > 0) EXPECT_GE(dpm->sigmas()[i], RefSigma(t - 1) * (1 - 1e-6)) << i;
    if (t < 999) EXPECT_LE(dpm->sigmas()[i], RefSigma(t + 1) * (1 + 1e-6)) << i;
  }
  EXPECT_EQ(s->timesteps().front(), 999);
  EXPECT_EQ(s->timesteps().back(), 0);
  EXPECT_EQ(dpm->sigmas().back(), 0.0);
  // The same ramp whatever the spacing.
  auto other = Make("dpmpp_2m_karras", WithSpacing("trailing"), n);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->timesteps(), s->timesteps());
}

// Two steps by hand (epsilon): the first in first order, the second with the midpoint correction
// from the first step's data prediction.
TEST(DpmSolverScheduler, TwoStepsByHand) {
  auto s = Make("dpmpp_2m", WithSpacing("linspace"), 5);
  ASSERT_NE(s, nullptr);
  const auto& sig = dynamic_cast<DpmSolverScheduler*>(s.get())->sigmas();
  const torch::Tensor x = T({0.7, -1.3});
  const torch::Tensor e0 = T({0.2, 0.9}), e1 = T({-0.4, 0.1});
  auto alpha = [](double g) { return 1.0 / std::sqrt(g * g + 1.0); };
  // Step 0: x0 = x / alpha - sigma * eps; x1 = (alpha1 s1 / (alpha0 s0)) x - alpha1 (s1/s0 - 1) x0.
  const torch::Tensor d0 = x / alpha(sig[0]) - sig[0] * e0;
  const torch::Tensor x1 = (alpha(sig[1]) * sig[1]) / (alpha(sig[0]) * sig[0]) * x -
                           alpha(sig[1]) * (sig[1] / sig[0] - 1) * d0;
  const torch::Tensor got1 = s->Step(e0, 0, x);
  EXPECT_LT((got1 - x1).abs().max().item<double>(), 1e-12);
  // Step 1: D = x0 + (x0 - x0') / (2 r), r = log(s0 / s1) / log(s1 / s2).
  const torch::Tensor d1 = x1 / alpha(sig[1]) - sig[1] * e1;
  const double r = std::log(sig[0] / sig[1]) / std::log(sig[1] / sig[2]);
  const torch::Tensor x2 = (alpha(sig[2]) * sig[2]) / (alpha(sig[1]) * sig[1]) * x1 -
                           alpha(sig[2]) * (sig[2] / sig[1] - 1) * (d1 + (d1 - d0) / (2 * r));
  EXPECT_LT((s->Step(e1, 1, got1) - x2).abs().max().item<double>(), 1e-12);
  // Steps in order only; a new loop starts at 0.
  EXPECT_THROW(s->Step(e1, 3, x2), c10::Error);
  EXPECT_NO_THROW(s->Step(e0, 0, x));
  EXPECT_THROW(s->Step(e0, 2, x), c10::Error);
}

// Perfect epsilon and v oracles land on x0 exactly: the last step returns the data prediction.
TEST(DpmSolverScheduler, OraclesRecoverX0) {
  torch::manual_seed(4);
  const torch::Tensor x0 = torch::randn({2, 4, 8, 8}, torch::kFloat64);
  const torch::Tensor noise = torch::randn({2, 4, 8, 8}, torch::kFloat64);
  for (const char* name : {"dpmpp_2m", "dpmpp_2m_karras"}) {
    for (const char* prediction : {"epsilon", "v_prediction"}) {
      SchedulerConfig c = WithSpacing("linspace");
      c.prediction_type = prediction;
      auto s = Make(name, c, 20);
      ASSERT_NE(s, nullptr);
      const auto& sig = dynamic_cast<DpmSolverScheduler*>(s.get())->sigmas();
      auto alpha = [](double g) { return 1.0 / std::sqrt(g * g + 1.0); };
      torch::Tensor x = alpha(sig[0]) * (x0 + sig[0] * noise);
      for (int i = 0; i < s->num_steps(); ++i) {
        const double a = alpha(sig[i]);
        const torch::Tensor out =
            std::string(prediction) == "epsilon"
                ? noise
                : a * noise - a * sig[i] * x0;  // sqrt(ab) eps - sqrt(1-ab) x0
        x = s->Step(out, i, s->ScaleModelInput(x, i));
      }
      EXPECT_LT((x - x0).abs().max().item<double>(), 1e-9) << name << " " << prediction;
    }
  }
}

// The SDE form by hand (Note [DPM-Solver++ 2M]): e^-h of the sample, 1 - e^-2h of D, and fresh
// noise; a second step uses the first's prediction as the ODE form does.
TEST(DpmSolverScheduler, SdeStepsByHand) {
  auto s = Make("dpmpp_2m_sde_karras", Sd15(), 5);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->stochastic());
  EXPECT_EQ(s->name(), "dpmpp_2m_sde_karras");
  const auto& sig = dynamic_cast<DpmSolverScheduler*>(s.get())->sigmas();
  const torch::Tensor x = T({0.7, -1.3}), e0 = T({0.2, 0.9}), e1 = T({-0.4, 0.1});
  const torch::Tensor z0 = T({0.3, -0.8}), z1 = T({1.1, 0.5});
  EXPECT_THROW(s->Step(e0, 0, x), c10::Error);  // no noise source
  int draws = 0;
  s->set_noise_source([&] { return ++draws == 1 ? z0 : z1; });
  auto alpha = [](double g) { return 1.0 / std::sqrt(g * g + 1.0); };
  auto step = [&](const torch::Tensor& sample, const torch::Tensor& d, const torch::Tensor& z,
                  int i) {
    const double a_t = alpha(sig[i + 1]), decay = sig[i + 1] / sig[i];
    return (a_t * sig[i + 1]) / (alpha(sig[i]) * sig[i]) * decay * sample +
           a_t * (1 - decay * decay) * d + a_t * sig[i + 1] * std::sqrt(1 - decay * decay) * z;
  };
  const torch::Tensor d0 = x / alpha(sig[0]) - sig[0] * e0;
  const torch::Tensor x1 = step(x, d0, z0, 0);
  const torch::Tensor got1 = s->Step(e0, 0, x);
  EXPECT_LT((got1 - x1).abs().max().item<double>(), 1e-12);
  const torch::Tensor d1 = x1 / alpha(sig[1]) - sig[1] * e1;
  const double r = std::log(sig[0] / sig[1]) / std::log(sig[1] / sig[2]);
  const torch::Tensor x2 = step(x1, d1 + (d1 - d0) / (2 * r), z1, 1);
  EXPECT_LT((s->Step(e1, 1, got1) - x2).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(draws, 2);
}

// An oracle that knows x0 (eps = (x / alpha - x0) / sigma, whatever noise the steps added) lands
// on x0 with the SDE form too.
TEST(DpmSolverScheduler, SdeOracleRecoversX0) {
  for (const char* name : {"dpmpp_2m_sde", "dpmpp_2m_sde_karras"}) {
    auto s = Make(name, WithSpacing("linspace"), 15);
    ASSERT_NE(s, nullptr);
    const auto& sig = dynamic_cast<DpmSolverScheduler*>(s.get())->sigmas();
    torch::manual_seed(7);
    const torch::Tensor x0 = torch::randn({2, 4, 8, 8}, torch::kFloat64);
    s->set_noise_source([] { return torch::randn({2, 4, 8, 8}, torch::kFloat64); });
    auto alpha = [](double g) { return 1.0 / std::sqrt(g * g + 1.0); };
    torch::Tensor x = alpha(sig[0]) * (x0 + sig[0] * torch::randn({2, 4, 8, 8}, torch::kFloat64));
    for (int i = 0; i < s->num_steps(); ++i) {
      x = s->Step((x / alpha(sig[i]) - x0) / sig[i], i, x);
    }
    EXPECT_LT((x - x0).abs().max().item<double>(), 1e-9) << name;
  }
}

// Note [UniPC] by hand over three steps: a first-order prediction, then a step whose corrector
// (of a first-order prediction: rho_1 = 1/2) precedes a second-order prediction, then one whose
// corrector solves for (rho_0, rho_1).
TEST(UniPcScheduler, ThreeStepsByHand) {
  auto s = Make("unipc", WithSpacing("linspace"), 6);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->timesteps(), Make("dpmpp_2m", WithSpacing("linspace"), 6)->timesteps());
  const auto& g = dynamic_cast<DpmSolverScheduler*>(s.get())->sigmas();
  auto alpha = [](double v) { return 1.0 / std::sqrt(v * v + 1.0); };
  auto x0_of = [&](const torch::Tensor& x, const torch::Tensor& e, int i) {
    return x / alpha(g[i]) - g[i] * e;
  };
  auto base = [&](const torch::Tensor& x, const torch::Tensor& m, int from, int to) {
    const double b = std::expm1(-std::log(g[from] / g[to]));
    return (alpha(g[to]) * g[to]) / (alpha(g[from]) * g[from]) * x - alpha(g[to]) * b * m;
  };
  auto bh = [&](int from, int to) { return std::expm1(-std::log(g[from] / g[to])); };
  const torch::Tensor x = T({0.7, -1.3});
  const torch::Tensor e0 = T({0.2, 0.9}), e1 = T({-0.4, 0.1}), e2 = T({0.5, -0.6});
  // Step 0: first order.
  const torch::Tensor m0 = x0_of(x, e0, 0);
  const torch::Tensor x1 = base(x, m0, 0, 1);
  const torch::Tensor got1 = s->Step(e0, 0, x);
  EXPECT_LT((got1 - x1).abs().max().item<double>(), 1e-12);
  // Step 1: corrector with rho_1 = 1/2, then the second-order predictor.
  const torch::Tensor m1 = x0_of(x1, e1, 1);
  const torch::Tensor c1 = base(x, m0, 0, 1) - alpha(g[1]) * bh(0, 1) * 0.5 * (m1 - m0);
  const double r1 = std::log(g[1] / g[0]) / std::log(g[1] / g[2]);
  const torch::Tensor x2 = base(c1, m1, 1, 2) - alpha(g[2]) * bh(1, 2) * 0.5 * (m0 - m1) / r1;
  const torch::Tensor got2 = s->Step(e1, 1, got1);
  EXPECT_LT((got2 - x2).abs().max().item<double>(), 1e-12);
  // Step 2: the corrector of a second-order prediction.
  const torch::Tensor m2 = x0_of(x2, e2, 2);
  const double h = std::log(g[1] / g[2]), b = bh(1, 2);
  const double r = std::log(g[1] / g[0]) / h;
  const double phi1 = b / -h - 1, phi2 = phi1 / -h - 0.5;
  const double b1 = phi1 / b, b2 = 2 * phi2 / b;
  const double rho0 = (b1 - b2) / (1 - r), rho1 = b1 - rho0;
  const torch::Tensor c2 =
      base(c1, m1, 1, 2) - alpha(g[2]) * b * (rho0 * (m0 - m1) / r + rho1 * (m2 - m1));
  const double r2 = std::log(g[2] / g[1]) / std::log(g[2] / g[3]);
  const torch::Tensor x3 = base(c2, m2, 2, 3) - alpha(g[3]) * bh(2, 3) * 0.5 * (m1 - m2) / r2;
  EXPECT_LT((s->Step(e2, 2, got2) - x3).abs().max().item<double>(), 1e-12);
}

// A perfect oracle lands on x0 (the predictions all equal x0: every correction vanishes).
TEST(UniPcScheduler, OracleRecoversX0) {
  torch::manual_seed(8);
  const torch::Tensor x0 = torch::randn({2, 4, 8, 8}, torch::kFloat64);
  const torch::Tensor noise = torch::randn({2, 4, 8, 8}, torch::kFloat64);
  for (const char* name : {"unipc", "unipc_karras"}) {
    auto s = Make(name, Sd15(), 12);
    ASSERT_NE(s, nullptr);
    const auto& g = dynamic_cast<DpmSolverScheduler*>(s.get())->sigmas();
    auto alpha = [](double v) { return 1.0 / std::sqrt(v * v + 1.0); };
    torch::Tensor x = alpha(g[0]) * (x0 + g[0] * noise);
    for (int i = 0; i < s->num_steps(); ++i) x = s->Step((x / alpha(g[i]) - x0) / g[i], i, x);
    EXPECT_LT((x - x0).abs().max().item<double>(), 1e-9) << name;
  }
}

// Dropping a row of the batch mid-loop (a cancelled request) keeps the other row's trajectory.
TEST(DpmSolverScheduler, KeepRowsFollowsTheBatch) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({2, 3}, torch::kFloat64);
  std::vector<torch::Tensor> eps;
  for (int i = 0; i < 6; ++i) eps.push_back(torch::randn({2, 3}, torch::kFloat64));
  auto alone = Make("dpmpp_2m", Sd15(), 6);
  auto batch = Make("dpmpp_2m", Sd15(), 6);
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(batch, nullptr);
  torch::Tensor a = x.slice(0, 1, 2), b = x;
  for (int i = 0; i < 6; ++i) {
    if (i == 3) {
      const torch::Tensor rows = torch::tensor(std::vector<int64_t>{1}, torch::kLong);
      batch->KeepRows(rows);
      b = b.index_select(0, rows);
    }
    a = alone->Step(eps[i].slice(0, 1, 2), i, a);
    b = batch->Step(i < 3 ? eps[i] : eps[i].slice(0, 1, 2), i, b);
  }
  ASSERT_EQ(b.size(0), 1);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-12);
}

// Note [Euler ancestral], by hand: down to sigma_down, then the source's noise times sigma_up.
TEST(EulerAncestralScheduler, StepByHand) {
  auto s = Make("euler_a", WithSpacing("linspace"), 5);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->stochastic());
  auto* euler = dynamic_cast<EulerScheduler*>(s.get());
  ASSERT_NE(euler, nullptr);
  auto plain = Make("euler", WithSpacing("linspace"), 5);
  EXPECT_EQ(s->timesteps(), plain->timesteps());
  EXPECT_EQ(s->init_noise_sigma(), plain->init_noise_sigma());
  const torch::Tensor x = T({0.7, -1.3}), eps = T({0.2, 0.9}), z = T({-0.5, 1.5});
  EXPECT_THROW(s->Step(eps, 0, x), c10::Error);  // no noise source
  int draws = 0;
  s->set_noise_source([&] {
    ++draws;
    return z;
  });
  for (int i : {0, 3, 4}) {
    const double sigma = euler->sigmas()[i], next = euler->sigmas()[i + 1];
    const double up = std::sqrt(next * next * (sigma * sigma - next * next) / (sigma * sigma));
    const double down = std::sqrt(next * next - up * up);
    const torch::Tensor x0 = x - sigma * eps;
    const torch::Tensor want = x + (x - x0) / sigma * (down - sigma) + up * z;
    EXPECT_LT((s->Step(eps, i, x) - want).abs().max().item<double>(), 1e-12) << i;
    if (i == 4) EXPECT_EQ(up, 0.0);
  }
  EXPECT_EQ(draws, 3);  // every step draws, the last one too (as diffusers)
  s->set_noise_source([] { return T({1.0, 2.0, 3.0}); });
  EXPECT_THROW(s->Step(eps, 0, x), c10::Error);  // noise of another shape
}

// An oracle that knows x0 (eps = (x - x0) / sigma, whatever noise the steps added) lands on x0.
TEST(EulerAncestralScheduler, OracleRecoversX0) {
  for (const char* prediction : {"epsilon", "v_prediction"}) {
    SchedulerConfig c = Sd15();
    c.prediction_type = prediction;
    auto s = Make("euler_a", c, 15);
    ASSERT_NE(s, nullptr);
    auto* euler = dynamic_cast<EulerScheduler*>(s.get());
    torch::manual_seed(6);
    const torch::Tensor x0 = torch::randn({2, 4, 8, 8}, torch::kFloat64);
    s->set_noise_source([] { return torch::randn({2, 4, 8, 8}, torch::kFloat64); });
    torch::Tensor x = x0 + euler->sigmas()[0] * torch::randn({2, 4, 8, 8}, torch::kFloat64);
    for (int i = 0; i < s->num_steps(); ++i) {
      const double sigma = euler->sigmas()[i];
      const torch::Tensor eps = (x - x0) / sigma;
      const double a = 1.0 / (sigma * sigma + 1.0);  // v = sqrt(a) eps - sqrt(1 - a) x0
      const torch::Tensor out =
          std::string(prediction) == "epsilon" ? eps : std::sqrt(a) * eps - std::sqrt(1 - a) * x0;
      x = s->Step(out, i, x);
    }
    EXPECT_LT((x - x0).abs().max().item<double>(), 1e-9) << prediction;
  }
}

TEST(SchedulerDtype, HalfInHalfOut) {
  for (const std::string& name : SchedulerNames()) {
    auto s = Make(name, Sd15(), 10);
    ASSERT_NE(s, nullptr);
    s->set_noise_source([] { return torch::zeros({2, 3}); });
    const torch::Tensor x = torch::ones({2, 3}, torch::kHalf);
    const torch::Tensor eps = torch::full({2, 3}, 0.5, torch::kHalf);
    EXPECT_EQ(s->Step(eps, 0, x).scalar_type(), torch::kHalf) << name;
    EXPECT_EQ(s->ScaleModelInput(x, 0).scalar_type(), torch::kHalf) << name;
    EXPECT_EQ(s->Step(eps, 0, x).sizes(), x.sizes()) << name;
  }
}

TEST(SchedulerErrors, BadStepCounts) {
  for (const std::string& name : SchedulerNames()) {
    auto s = MakeScheduler(name, Sd15());
    ASSERT_TRUE(s.ok());
    for (int bad : {0, -3, 1001}) {
      const Status st = (*s)->SetTimesteps(bad);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name << " " << bad;
      EXPECT_NE(st.message().find("between 1 and 1000"), std::string::npos) << st.message();
    }
    EXPECT_EQ((*s)->num_steps(), 0);
    // Step before SetTimesteps, or past the last step, throws c10::Error.
    EXPECT_THROW((*s)->Step(T({1.0}), 0, T({1.0})), c10::Error);
    ASSERT_TRUE((*s)->SetTimesteps(5).ok());
    EXPECT_THROW((*s)->Step(T({1.0}), 5, T({1.0})), c10::Error);
    EXPECT_THROW((*s)->ScaleModelInput(T({1.0}), -1), c10::Error);
  }
  // DDIM: 1000 leading steps + offset 1 would need alphas_cumprod[1000].
  auto ddim = MakeScheduler("ddim", Sd15());
  const Status st = (*ddim)->SetTimesteps(1000);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("1000"), std::string::npos) << st.message();
}

TEST(SchedulerErrors, UnknownNameListsValidOnes) {
  auto s = MakeScheduler("dpm++", Sd15());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("dpm++"), std::string::npos);
  EXPECT_NE(s.status().message().find("ddim, euler, euler_a, dpmpp_2m, dpmpp_2m_karras, "
                                      "dpmpp_2m_sde, dpmpp_2m_sde_karras, unipc, unipc_karras"),
            std::string::npos)
      << s.status().message();
  EXPECT_EQ(SchedulerNames(), (std::vector<std::string>{
                                  "ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras",
                                  "dpmpp_2m_sde", "dpmpp_2m_sde_karras", "unipc", "unipc_karras"}));
}

TEST(SchedulerErrors, BadConfigNamesTheField) {
  struct Case {
    void (*mutate)(SchedulerConfig&);
    const char* field;
  };
  const Case cases[] = {
      {[](SchedulerConfig& c) { c.beta_schedule = "cosine"; }, "beta_schedule"},
      {[](SchedulerConfig& c) { c.timestep_spacing = "middle"; }, "timestep_spacing"},
      {[](SchedulerConfig& c) { c.prediction_type = "sample"; }, "prediction_type"},
      {[](SchedulerConfig& c) { c.beta_start = 0.0; }, "beta_start"},
      {[](SchedulerConfig& c) { c.beta_end = 1.0; }, "beta_end"},
      {[](SchedulerConfig& c) {
         c.beta_start = 0.02;
         c.beta_end = 0.01;
       },
       "less than beta_end"},
      {[](SchedulerConfig& c) { c.num_train_timesteps = 0; }, "num_train_timesteps"},
      {[](SchedulerConfig& c) { c.steps_offset = -1; }, "steps_offset"},
  };
  for (const Case& c : cases) {
    SchedulerConfig config;
    c.mutate(config);
    for (const std::string& name : SchedulerNames()) {
      auto s = MakeScheduler(name, config);
      ASSERT_FALSE(s.ok()) << c.field;
      EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.status().message().find(c.field), std::string::npos) << s.status().message();
    }
    EXPECT_FALSE(ValidateSchedulerConfig(config).ok());
  }
  EXPECT_TRUE(ValidateSchedulerConfig(SchedulerConfig{}).ok());
}

// Note [Flow-matching Euler]: the sigmas diffusers' FlowMatchEulerDiscreteScheduler gives
// FluxPipeline (4 steps; 1024 latent tokens, i.e. a 512x512 image), with and without dynamic
// shifting, as diffusers 0.42 computed them.
TEST(FlowMatchEulerScheduler, SigmasMatchDiffusers) {
  FlowShiftConfig dynamic;
  dynamic.shift = 3.0;
  dynamic.use_dynamic_shifting = true;
  EXPECT_NEAR(FlowMatchEulerScheduler::Mu(dynamic, 1024), 0.63, 1e-12);
  FlowMatchEulerScheduler s(dynamic);
  ASSERT_TRUE(s.SetTimesteps(4, 1024).ok());
  const std::vector<double> want = {1.0, 0.8492348194122314, 0.652489423751831, 0.38494473695755005,
                                    0.0};
  ASSERT_EQ(s.sigmas().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(s.sigmas()[i], want[i], 1e-6) << i;
  EXPECT_EQ(s.num_steps(), 4);
  EXPECT_DOUBLE_EQ(s.timestep(1), s.sigmas()[1]);

  FlowShiftConfig fixed;
  fixed.shift = 3.0;
  FlowMatchEulerScheduler f(fixed);
  ASSERT_TRUE(f.SetTimesteps(4, 1024).ok());
  const std::vector<double> shifted = {1.0, 0.9, 0.75, 0.5, 0.0};
  for (size_t i = 0; i < shifted.size(); ++i) EXPECT_NEAR(f.sigmas()[i], shifted[i], 1e-6) << i;

  ASSERT_TRUE(f.SetTimesteps(1, 1024).ok());
  EXPECT_EQ(f.sigmas(), (std::vector<double>{1.0, 0.0}));
  EXPECT_FALSE(f.SetTimesteps(0, 1024).ok());
  EXPECT_FALSE(f.SetTimesteps(4, 0).ok());
}

// With the true velocity (noise - x0) every step lands on the line between noise and x0, and the
// last one on x0; half-precision samples come back in their dtype.
TEST(FlowMatchEulerScheduler, TrueVelocityRecoversX0) {
  FlowShiftConfig config;
  config.use_dynamic_shifting = true;
  FlowMatchEulerScheduler s(config);
  ASSERT_TRUE(s.SetTimesteps(7, 4096).ok());
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({2, 5, 3});
  const torch::Tensor noise = torch::randn({2, 5, 3});
  torch::Tensor x = noise;
  for (int i = 0; i < s.num_steps(); ++i) {
    x = s.Step(noise - x0, i, x);
    const double sigma = s.sigmas()[i + 1];
    EXPECT_TRUE(torch::allclose(x, (1 - sigma) * x0 + sigma * noise, 1e-5, 1e-5)) << i;
  }
  EXPECT_TRUE(torch::allclose(x, x0, 1e-5, 1e-5));
  const torch::Tensor half =
      s.Step(torch::ones({2}, torch::kHalf), 0, torch::zeros({2}, torch::kHalf));
  EXPECT_EQ(half.scalar_type(), torch::kHalf);
  EXPECT_THROW(s.Step(x, 7, x), c10::Error);
}

}  // namespace
}  // namespace qpool
