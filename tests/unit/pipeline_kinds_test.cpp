// PipelineKinds: the kinds the server ships, found by the manifest's `kind:`, and the catalog
// the manifest parser checks against.
#include "pipeline/pipeline_kinds.h"

#include <gtest/gtest.h>

#include "testing/kind_catalog.h"

namespace qpool {
namespace {

TEST(PipelineKinds, BuiltinKindsAreFoundByName) {
  const auto kinds = PipelineKinds::Builtin();
  const PipelineKind* sd = kinds->Find("sd");
  ASSERT_NE(sd, nullptr);
  EXPECT_EQ(sd->name(), "sd");
  ASSERT_EQ(sd->components().size(), 3u);
  EXPECT_EQ(sd->components()[0].role, ComponentRole::kTextEncoder);
  EXPECT_EQ(sd->components()[1].role, ComponentRole::kDenoiser);
  EXPECT_EQ(sd->components()[2].role, ComponentRole::kDecoder);
  // The forward signatures a load checks (Note [Component signatures]).
  EXPECT_EQ(sd->components()[1].inputs,
            (std::vector<std::string>{"sample", "timestep", "encoder_hidden_states"}));
  const PipelineKind* sdxl = kinds->Find("sdxl");
  ASSERT_NE(sdxl, nullptr);
  EXPECT_EQ(sdxl->components()[1].name, "text_encoder_2");
  EXPECT_EQ(sdxl->components()[1].outputs, 2u);
  EXPECT_EQ(sdxl->components()[2].inputs.size(), 5u);
  EXPECT_GT(sd->default_working_bytes_per_pixel(), 0);
  EXPECT_EQ(kinds->Find("no-such-kind"), nullptr);
  EXPECT_EQ(kinds->Find(""), nullptr);
}

// The torch-free tests of the manifest parser use testing::BuiltinKindCatalog; it must be what
// the server parses with.
TEST(PipelineKinds, CatalogIsWhatTheServerParsesWith) {
  EXPECT_EQ(PipelineKinds::Builtin()->Catalog(), testing::BuiltinKindCatalog());
}

TEST(PipelineKinds, LoadingAManifestOfAnUnknownKindNamesIt) {
  PipelineManifest manifest;
  manifest.kind = "nope";
  manifest.path = "/repo/x/pipeline.yaml";
  auto loaded = PipelineKinds::Builtin()->Load(manifest, c10::Device(c10::kCPU), c10::kFloat, {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("/repo/x/pipeline.yaml: kind 'nope'"), std::string::npos)
      << loaded.status().message();
}

}  // namespace
}  // namespace qpool
