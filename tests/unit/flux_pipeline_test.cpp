// Kind flux without components: its requests, and the latent packing and position ids its loop
// gives the transformer (Note [FLUX conditioning]), checked against diffusers' definitions.
#include "pipeline/flux/flux_pipeline.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipeline/flux/flux_kind.h"

namespace qpool {
namespace {

// diffusers' _pack_latents on [1, 2, 4, 4]: token (r, c) holds the 2x2 patch at (2r, 2c) of each
// channel, channel-major, row-major inside the patch.
TEST(FluxPipeline, PackIsDiffusersPackingAndUnpackInvertsIt) {
  const torch::Tensor latents = torch::arange(32, torch::kFloat).reshape({1, 2, 4, 4});
  const torch::Tensor packed = FluxPipeline::Pack(latents);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{1, 4, 8}));
  // Token 1 is patch (0, 1): rows 0-1, columns 2-3 of channel 0, then of channel 1.
  const std::vector<float> token1 = {2, 3, 6, 7, 18, 19, 22, 23};
  EXPECT_TRUE(torch::equal(packed[0][1], torch::tensor(token1)));
  EXPECT_TRUE(torch::equal(FluxPipeline::Unpack(packed, 4, 4), latents));
  const torch::Tensor wide = torch::randn({3, 16, 6, 10});
  EXPECT_TRUE(torch::equal(FluxPipeline::Unpack(FluxPipeline::Pack(wide), 6, 10), wide));
}

TEST(FluxPipeline, ImageIdsAreRowAndColumnOfEachToken) {
  const torch::Tensor ids = FluxPipeline::ImageIds(4, 6);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{6, 3}));
  EXPECT_EQ(ids.scalar_type(), torch::kFloat);
  const std::vector<float> want = {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 0, 0, 1, 1, 0, 1, 2};
  EXPECT_TRUE(torch::equal(ids.flatten(), torch::tensor(want)));
}

PipelineManifest FluxManifest() {
  PipelineManifest m;
  m.name = "flux-tiny";
  m.kind = "flux";
  m.latent.channels = 16;
  m.latent.downscale = 8;
  m.defaults.scheduler = "euler";
  m.defaults.guidance_scale = 3.5;
  m.defaults.width = m.defaults.height = 512;
  return m;
}

TEST(FluxKind, GuidanceIsEmbeddedSizesAreMultiplesOf16AndEulerIsItsSampler) {
  const FluxKind kind;
  GenerateRequestIn in;
  in.guidance_scale = 7.0f;
  auto p = kind.ResolveGenerate(in, FluxManifest());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->do_cfg());  // one transformer call per step
  EXPECT_DOUBLE_EQ(p->guidance_scale, 7.0);
  EXPECT_EQ(p->scheduler, "euler");

  in.width = 520;  // a multiple of 8, not of 16
  auto odd = kind.ResolveGenerate(in, FluxManifest());
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("width must be a positive multiple of 16 (got 520)"),
            std::string::npos)
      << odd.status().message();

  in.width.reset();
  in.scheduler = "ddim";
  auto ddim = kind.ResolveGenerate(in, FluxManifest());
  ASSERT_FALSE(ddim.ok());
  EXPECT_NE(ddim.status().message().find("unknown scheduler 'ddim'; valid schedulers: euler"),
            std::string::npos)
      << ddim.status().message();

  // Classifier-free guidance on top of the embedded guidance: true_cfg_scale and a negative
  // prompt, both.
  in.scheduler.clear();
  in.true_cfg_scale = 4.0f;
  auto no_negative = kind.ResolveGenerate(in, FluxManifest());
  ASSERT_TRUE(no_negative.ok()) << no_negative.status().ToString();
  EXPECT_FALSE(no_negative->do_cfg());
  in.negative_prompt = "blurry";
  auto cfg = kind.ResolveGenerate(in, FluxManifest());
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_TRUE(cfg->do_cfg());
  EXPECT_DOUBLE_EQ(cfg->cfg_scale(), 4.0);
  // An empty negative prompt that is given runs true CFG against "" (diffusers' "", not None).
  in.negative_prompt = "";
  auto empty = kind.ResolveGenerate(in, FluxManifest());
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->do_cfg());
  in.true_cfg_scale = 101.0f;
  EXPECT_FALSE(kind.ResolveGenerate(in, FluxManifest()).ok());
  // Kinds whose guidance_scale is CFG refuse it.
  PipelineManifest sd = FluxManifest();
  sd.kind = "sd";
  in.true_cfg_scale = 2.0f;
  auto refused = ResolveGenerateRequest(in, sd);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("true_cfg_scale is for pipelines with embedded "
                                            "guidance; pipeline 'flux-tiny' (kind sd)"),
            std::string::npos)
      << refused.status().message();

  in = GenerateRequestIn();
  in.original_width = 1024;  // SDXL's size conditioning
  EXPECT_FALSE(kind.ResolveGenerate(in, FluxManifest()).ok());
  EXPECT_EQ(kind.ManifestSpec().schedule, ScheduleFamily::kFlowMatch);
  EXPECT_EQ(kind.components()[2].inputs.size(), 7u);
}

}  // namespace
}  // namespace qpool
