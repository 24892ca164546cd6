// The multistep and ancestral samplers against values computed by hand and perfect oracles:
// DPM-Solver++ 2M (and its SDE form), UniPC and Euler ancestral (SD 1.x config unless stated).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "pipeline/scheduler/dpm_solver_scheduler.h"
#include "pipeline/scheduler/euler_scheduler.h"
#include "pipeline/scheduler/scheduler.h"
#include "testing/scheduler_helpers.h"

namespace qpool {
namespace {

using testing::Make;
using testing::RefSigma;
using testing::Sd15;
using testing::T;
using testing::WithSpacing;

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

}  // namespace
}  // namespace qpool
