// ResolveGenerateRequest: defaults, limits and the messages users see for bad fields.
#include "pipeline/generate_request.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace qpool {
namespace {

PipelineManifest TinyManifest() {
  PipelineManifest m;
  m.name = "tiny";
  m.kind = "sd";
  m.defaults.steps = 4;
  m.defaults.guidance_scale = 7.5;
  m.defaults.width = 64;
  m.defaults.height = 48;
  m.defaults.scheduler = "ddim";
  m.limits.max_steps = 50;
  m.limits.max_width = 256;
  m.limits.max_height = 256;
  m.limits.max_images = 4;
  m.limits.max_prompts = 3;
  return m;
}

GenerateRequestIn Request() {
  GenerateRequestIn in;
  in.pipeline = "tiny";
  in.prompt = "a fox";
  return in;
}

void ExpectInvalid(const GenerateRequestIn& in, const std::string& needle) {
  auto p = ResolveGenerateRequest(in, TinyManifest());
  ASSERT_FALSE(p.ok()) << "accepted a request that should fail with: " << needle;
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().message();
}

TEST(GenerateRequest, UnsetFieldsTakeManifestDefaults) {
  auto p = ResolveGenerateRequest(Request(), TinyManifest());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->steps, 4);
  EXPECT_DOUBLE_EQ(p->guidance_scale, 7.5);
  EXPECT_EQ(p->width, 64);
  EXPECT_EQ(p->height, 48);
  EXPECT_EQ(p->num_images, 1);
  EXPECT_EQ(p->scheduler, "ddim");
  EXPECT_TRUE(p->do_cfg());
  EXPECT_LT(p->seed, uint64_t{1} << 53);
}

TEST(GenerateRequest, ExplicitValuesAreKept) {
  auto in = Request();
  in.steps = 50;
  in.guidance_scale = 1.0f;
  in.width = 256;
  in.height = 8;
  in.num_images = 4;
  in.seed = 1234;
  in.scheduler = "euler";
  auto p = ResolveGenerateRequest(in, TinyManifest());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->steps, 50);
  EXPECT_FALSE(p->do_cfg());
  EXPECT_EQ(p->width, 256);
  EXPECT_EQ(p->height, 8);
  EXPECT_EQ(p->num_images, 4);
  EXPECT_EQ(p->seed, 1234u);
  EXPECT_EQ(p->scheduler, "euler");
}

TEST(GenerateRequest, SizeConditioningDefaultsToTheImageSize) {
  auto in = Request();
  in.width = 128;
  auto p = ResolveGenerateRequest(in, TinyManifest(), RequestFeatures{/*size_conditioning=*/true});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->size.original_width, 128);
  EXPECT_EQ(p->size.original_height, 48);
  EXPECT_EQ(p->size.target_width, 128);
  EXPECT_EQ(p->size.target_height, 48);
  EXPECT_EQ(p->size.crop_top, 0);
  EXPECT_EQ(p->size.crop_left, 0);

  in.original_width = 4096;
  in.original_height = 2048;
  in.target_width = 1;
  in.target_height = 16384;
  in.crop_top = 0;
  in.crop_left = 300;
  p = ResolveGenerateRequest(in, TinyManifest(), RequestFeatures{true});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->size.original_width, 4096);
  EXPECT_EQ(p->size.original_height, 2048);
  EXPECT_EQ(p->size.target_width, 1);
  EXPECT_EQ(p->size.target_height, 16384);
  EXPECT_EQ(p->size.crop_left, 300);
}

TEST(GenerateRequest, SizeConditioningIsCheckedAndRefusedByKindsWithoutIt) {
  auto in = Request();
  in.crop_top = 16;
  auto p = ResolveGenerateRequest(in, TinyManifest());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "crop_top is size conditioning, which pipeline 'tiny' (kind sd) does not take");

  in = Request();
  in.original_width = 0;
  p = ResolveGenerateRequest(in, TinyManifest(), RequestFeatures{true});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "original_width must be between 1 and 16384 (got 0)");
  in = Request();
  in.crop_left = 4000000000u;
  p = ResolveGenerateRequest(in, TinyManifest(), RequestFeatures{true});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "crop_left must be between 0 and 16384 (got 4000000000)");
}

TEST(GenerateRequest, RandomSeedsDiffer) {
  auto a = ResolveGenerateRequest(Request(), TinyManifest());
  auto b = ResolveGenerateRequest(Request(), TinyManifest());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->seed, b->seed);
}

TEST(GenerateRequest, BadFieldsNameTheField) {
  auto in = Request();
  in.steps = 0;
  ExpectInvalid(in, "steps must be between 1 and 50");
  in = Request();
  in.steps = 51;
  ExpectInvalid(in, "(got 51)");
  in = Request();
  in.width = 100;
  ExpectInvalid(in, "width must be a positive multiple of 8 (got 100)");
  in = Request();
  in.height = 0;
  ExpectInvalid(in, "height must be a positive multiple of 8");
  in = Request();
  in.width = 264;
  ExpectInvalid(in, "width must be at most 256");
  in = Request();
  in.num_images = 0;
  ExpectInvalid(in, "num_images must be between 1 and 4");
  in = Request();
  in.num_images = 5;
  ExpectInvalid(in, "num_images");
  in = Request();
  in.guidance_scale = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(in, "guidance_scale must be a finite number");
  in = Request();
  in.guidance_scale = -1.0f;
  ExpectInvalid(in, "guidance_scale");
  in = Request();
  in.scheduler = "pndm";
  ExpectInvalid(in,
                "unknown scheduler 'pndm'; valid schedulers: ddim, euler, euler_a, dpmpp_2m, "
                "dpmpp_2m_karras, dpmpp_2m_sde, dpmpp_2m_sde_karras, unipc, unipc_karras");
  // A long name is quoted as a prefix: a 1 MiB one no longer came back whole in the error.
  in = Request();
  in.scheduler = std::string(1 << 20, 'x');
  ExpectInvalid(in, "unknown scheduler '" + std::string(64, 'x') + "... (1048576 bytes)'");
  in = Request();
  in.steps = 4000000000u;  // beyond int: still a clear range error, no overflow
  ExpectInvalid(in, "steps must be between 1 and 50");
  // ... that says what the client sent, not the clamped value.
  ExpectInvalid(in, "(got 4000000000)");
  in.steps.reset();
  in.width = 2147483647u;
  ExpectInvalid(in, "width must be at most 256 for this pipeline (got 2147483647)");
  in.width.reset();
  in.num_images = 4294967295u;
  ExpectInvalid(in, "(got 4294967295)");
}

TEST(GenerateRequest, EncodePromptCount) {
  using Prompts = std::vector<std::string>;
  EXPECT_EQ(ValidateEncodePrompts({}, TinyManifest()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateEncodePrompts(Prompts(3, "a fox"), TinyManifest()).ok());
  // One prompt size limit for Generate and Encode.
  Status big =
      ValidateEncodePrompts({"a fox", std::string(kMaxPromptBytes + 1, 'x')}, TinyManifest());
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("prompts[1] must be at most 16384 bytes"), std::string::npos)
      << big.message();
  EXPECT_TRUE(ValidateEncodePrompts({std::string(kMaxPromptBytes, 'x')}, TinyManifest()).ok());
  Status s = ValidateEncodePrompts(Prompts(4, "a fox"), TinyManifest());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 3 prompts"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace qpool
