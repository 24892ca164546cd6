// DDIM, Euler and flow-matching Euler schedulers against values computed by hand, and what every
// scheduler shares (dtypes, errors); SD 1.x config unless stated. The multistep and ancestral
// samplers: multistep_scheduler_test.cpp.
#include "pipeline/scheduler/scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "pipeline/scheduler/ddim_scheduler.h"
#include "pipeline/scheduler/euler_scheduler.h"
#include "pipeline/scheduler/flow_match_scheduler.h"
#include "pipeline/scheduler/flow_unipc_scheduler.h"
#include "testing/scheduler_helpers.h"

namespace qpool {
namespace {

using testing::Make;
using testing::RefAlphaCumprod;
using testing::RefBeta;
using testing::RefSigma;
using testing::Sd15;
using testing::T;
using testing::WithSpacing;

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

TEST(DdimScheduler, AlphaOneAndClippedX0AsDiffusersDefaults) {
  SchedulerConfig config = Sd15();
  config.set_alpha_to_one = true;
  config.clip_sample = true;
  config.clip_sample_range = 1.5;
  auto s = Make("ddim", config, 10);
  ASSERT_NE(s, nullptr);
  // Step 0 (t = 901, prev = 801): x0 = (x - sqrt(1 - a_t) eps) / sqrt(a_t) clamped to
  // [-1.5, 1.5], then x_prev = sqrt(a_p) x0 + sqrt(1 - a_p) eps with eps unchanged.
  const double a_t = RefAlphaCumprod(901), a_p = RefAlphaCumprod(801);
  const torch::Tensor x = T({1.0, -2.0, 0.05}), eps = T({0.5, 0.25, -0.05});
  const torch::Tensor out = s->Step(eps, 0, x);
  int clamped = 0;
  for (int i = 0; i < 3; ++i) {
    const double xi = x[i].item<double>(), ei = eps[i].item<double>();
    const double raw = (xi - std::sqrt(1 - a_t) * ei) / std::sqrt(a_t);
    const double x0 = std::clamp(raw, -1.5, 1.5);
    clamped += x0 != raw;
    EXPECT_NEAR(out[i].item<double>(), std::sqrt(a_p) * x0 + std::sqrt(1 - a_p) * ei, 1e-12) << i;
  }
  EXPECT_EQ(clamped, 2);  // x0 is 4.25, -19.0 and 0.84 at t = 901
  // Last step: prev < 0 -> a_prev = 1, so x_prev = x0 itself.
  const double a_1 = RefAlphaCumprod(1);
  const double x0 = (1.0 - std::sqrt(1 - a_1) * 0.5) / std::sqrt(a_1);
  EXPECT_NEAR(s->Step(T({0.5}), 9, T({1.0}))[0].item<double>(), std::clamp(x0, -1.5, 1.5), 1e-12);
  // v-prediction: x0 = sqrt(a) x - sqrt(1 - a) v, eps = sqrt(a) v + sqrt(1 - a) x.
  config.prediction_type = "v_prediction";
  auto v = Make("ddim", config, 10);
  const torch::Tensor vo = v->Step(eps, 0, x);
  for (int i = 0; i < 3; ++i) {
    const double xi = x[i].item<double>(), vi = eps[i].item<double>();
    const double x0v = std::clamp(std::sqrt(a_t) * xi - std::sqrt(1 - a_t) * vi, -1.5, 1.5);
    const double ev = std::sqrt(a_t) * vi + std::sqrt(1 - a_t) * xi;
    EXPECT_NEAR(vo[i].item<double>(), std::sqrt(a_p) * x0v + std::sqrt(1 - a_p) * ev, 1e-12) << i;
  }
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

// The scheduler's own sigmas (FlowSigmas::kScheduler: HiDreamImagePipeline passes none), 4 steps,
// as diffusers 0.42 computed them: HiDream-I1 Dev's static shift 6 (the training schedule's last
// sigma shifted, then every sigma shifted again), and a dynamic shift with HiDream's fixed mu
// 1.15 (the manifest's flat base_shift = max_shift line: any image length gives it).
TEST(FlowMatchEulerScheduler, SchedulerSigmasMatchDiffusers) {
  FlowShiftConfig fixed;
  fixed.shift = 6.0;
  FlowMatchEulerScheduler f(fixed, FlowSigmas::kScheduler, 1000);
  ASSERT_TRUE(f.SetTimesteps(4, 16).ok());
  const std::vector<double> want = {1.0, 0.923711359500885, 0.753333330154419, 0.03478260710835457,
                                    0.0};
  ASSERT_EQ(f.sigmas().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f.sigmas()[i], want[i], 1e-6) << i;

  FlowShiftConfig dynamic;
  dynamic.use_dynamic_shifting = true;
  dynamic.base_shift = dynamic.max_shift = 1.15;
  FlowMatchEulerScheduler d(dynamic, FlowSigmas::kScheduler, 1000);
  for (int64_t tokens : {16, 4096, 100000}) {
    ASSERT_TRUE(d.SetTimesteps(4, tokens).ok());
    const std::vector<double> mu = {1.0, 0.8634974360466003, 0.6129788756370544,
                                    0.0031513916328549385, 0.0};
    for (size_t i = 0; i < mu.size(); ++i) EXPECT_NEAR(d.sigmas()[i], mu[i], 1e-6) << i;
  }
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


// Note [Flow-matching UniPC]: the sigmas and timesteps diffusers' UniPCMultistepScheduler (flow
// sigmas, flow_prediction) gives, 4 steps, as diffusers 0.42 computed them: HiDream-I1 Full's
// flow_shift 3, and with dynamic shifting at FluxPipeline's mu 0.63 (a 512x512 FLUX image; it
// hands the scheduler no sigmas, so the FluxPipeline spacing changes nothing).
TEST(FlowUniPcScheduler, SigmasAndTimestepsMatchDiffusers) {
  FlowShiftConfig fixed;
  fixed.shift = 3.0;
  FlowUniPcScheduler own(fixed, FlowSigmas::kScheduler, 1000);
  ASSERT_TRUE(own.SetTimesteps(4, 16).ok());
  const std::vector<double> want = {0.9999989867210388, 0.900119960308075, 0.7503747940063477,
                                    0.5009989738464355, 0.0};
  ASSERT_EQ(own.sigmas().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(own.sigmas()[i], want[i], 1e-7) << i;
  const std::vector<double> steps = {999, 900, 750, 500};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(own.timestep(i) * 1000, steps[i]) << i;

  FlowShiftConfig dynamic;
  dynamic.use_dynamic_shifting = true;
  FlowUniPcScheduler flux(dynamic, FlowSigmas::kFluxPipeline, 1000);
  ASSERT_TRUE(flux.SetTimesteps(4, 1024).ok());
  const std::vector<double> shifted = {0.9999989867210388, 0.8494055271148682, 0.6529428362846375,
                                       0.38589128851890564, 0.0};
  for (size_t i = 0; i < shifted.size(); ++i) EXPECT_NEAR(flux.sigmas()[i], shifted[i], 1e-7) << i;
  const std::vector<double> flux_steps = {999, 849, 652, 385};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(flux.timestep(i) * 1000, flux_steps[i]) << i;
  EXPECT_FALSE(flux.SetTimesteps(0, 1024).ok());
}

// With the true velocity every data prediction is x0, so each corrected and predicted sample
// lies on the line between noise and x0 (Note [UniPC]) and the last is x0; steps out of order and
// unknown sampler names are refused.
TEST(FlowUniPcScheduler, TrueVelocityRecoversX0) {
  FlowShiftConfig config;
  config.shift = 3.0;
  StatusOr<std::unique_ptr<FlowSampler>> made =
      MakeFlowSampler("unipc", config, FlowSigmas::kScheduler, 1000);
  ASSERT_TRUE(made.ok());
  const std::unique_ptr<FlowSampler>& s = made.value();
  EXPECT_EQ(s->name(), "unipc");
  ASSERT_TRUE(s->SetTimesteps(6, 64).ok());
  torch::manual_seed(1);
  const torch::Tensor x0 = torch::randn({2, 5, 3}, torch::kDouble);
  const torch::Tensor noise = torch::randn({2, 5, 3}, torch::kDouble);
  torch::Tensor x = (1 - s->sigmas()[0]) * x0 + s->sigmas()[0] * noise;
  for (int i = 0; i < s->num_steps(); ++i) {
    x = s->Step(noise - x0, i, x);
    const double sigma = s->sigmas()[i + 1];
    EXPECT_TRUE(torch::allclose(x, (1 - sigma) * x0 + sigma * noise, 1e-9, 1e-9)) << i;
  }
  EXPECT_TRUE(torch::allclose(x, x0, 1e-9, 1e-9));
  EXPECT_THROW(s->Step(x, 3, x), c10::Error);
  EXPECT_FALSE(MakeFlowSampler("ddim", config, FlowSigmas::kScheduler, 1000).ok());
}

}  // namespace
}  // namespace qpool
