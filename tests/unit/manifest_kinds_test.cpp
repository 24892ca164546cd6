// pipeline.yaml of the kinds with sections of their own (sdxl, flux, hidream): each kind's
// sections parsed, other kinds' refused, and their bounds (the shared rules are in
// manifest_test.cpp and manifest_rules_test.cpp).
#include "manifest_fixture.h"

namespace qpool::manifest_testing {
namespace {
// Kind sdxl: a second tokenizer, the conditioning section and a component in its own dtype.
const char kSdxl[] = R"(kind: sdxl
components:
  text_encoder: {file: text_encoder.pt}
  text_encoder_2: {file: unet.pt}
  unet: {file: unet.pt}
  vae_decoder: {file: vae_decoder.pt, dtype: float32}
tokenizer:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
tokenizer_2:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
  pad_token: "!"
conditioning:
  force_zeros_for_empty_prompt: true
)";

// Note [File digests]: a component's sha256 is kept for the load to check; a malformed one is
// refused by field.
TEST_F(ManifestTest, ComponentDigestsAreParsedAndChecked) {
  const std::string digest(64, 'c');
  std::string with = kSdxl;
  with.replace(with.find("unet: {file: unet.pt}"), 21,
               "unet: {file: unet.pt, sha256: " + digest + "}");
  auto r = Parse(with);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->components[2].sha256, digest);
  EXPECT_EQ(r->components[0].sha256, "");
  for (const std::string bad : {std::string(63, 'c'), std::string(64, 'C'), std::string("")}) {
    std::string text = kSdxl;
    text.replace(text.find("unet: {file: unet.pt}"), 21,
                 "unet: {file: unet.pt, sha256: \"" + bad + "\"}");
    ExpectInvalid(Parse(text), {"components.unet.sha256", "64 lowercase hex digits"});
  }
}

TEST_F(ManifestTest, SdxlManifestParsesItsOwnSections) {
  auto r = Parse(kSdxl);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, "sdxl");
  ASSERT_EQ(r->components.size(), 4u);
  EXPECT_EQ(r->components[1].name, "text_encoder_2");
  EXPECT_EQ(r->components[2].dtype, "");
  EXPECT_EQ(r->components[3].dtype, "float32");
  ASSERT_TRUE(r->tokenizer_2.has_value());
  EXPECT_EQ(r->tokenizer_2->pad_token, "!");
  EXPECT_EQ(r->tokenizer_2->vocab, dir_ + "/tokenizer/vocab.json");
  EXPECT_EQ(r->tokenizer.pad_token, "<|endoftext|>");
  EXPECT_TRUE(r->conditioning.force_zeros_for_empty_prompt);

  // The second tokenizer is required, and is checked as the first one.
  ExpectInvalid(Parse(RemoveField(kSdxl, "tokenizer_2")), {"field 'tokenizer_2' is required"});
  std::string bad = kSdxl;
  bad.replace(bad.find("pad_token: \"!\""), 14, "max_length: 1");
  ExpectInvalid(Parse(bad), {"field 'tokenizer_2.max_length' must be between 2 and 1024 (got 1)"});
  // conditioning is optional; its flag defaults to off.
  auto plain = Parse(RemoveField(kSdxl, "conditioning"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->conditioning.force_zeros_for_empty_prompt);
  EXPECT_FALSE(Parse(kMinimal)->tokenizer_2.has_value());
}

// Kind flux: a SentencePiece tokenizer_2, a flow-matching scheduler section and a VAE shift.
const char kFlux[] = R"(kind: flux
components:
  text_encoder: {file: text_encoder.pt}
  text_encoder_2: {file: unet.pt}
  transformer: {file: unet.pt}
  vae_decoder: {file: vae_decoder.pt}
tokenizer:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
tokenizer_2:
  model: tokenizer/vocab.json
  max_length: 256
scheduler:
  shift: 3.0
  use_dynamic_shifting: true
  base_shift: 0.5
  max_shift: 1.15
latent:
  channels: 16
  scaling_factor: 0.3611
  shift_factor: 0.1159
defaults:
  guidance_scale: 3.5
)";

TEST_F(ManifestTest, FluxManifestParsesItsOwnSections) {
  auto r = Parse(kFlux);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->components[2].name, "transformer");
  ASSERT_TRUE(r->tokenizer_2.has_value());
  EXPECT_EQ(r->tokenizer_2->model, dir_ + "/tokenizer/vocab.json");
  EXPECT_EQ(r->tokenizer_2->max_length, 256);
  EXPECT_TRUE(r->scheduler.flow.use_dynamic_shifting);
  EXPECT_DOUBLE_EQ(r->scheduler.flow.shift, 3.0);
  EXPECT_EQ(r->scheduler.flow.max_image_seq_len, 4096);  // the default
  EXPECT_DOUBLE_EQ(r->latent.shift_factor, 0.1159);
  EXPECT_EQ(r->defaults.scheduler, "euler");  // flow matching's only sampler
  EXPECT_DOUBLE_EQ(Parse(kMinimal)->latent.shift_factor, 0.0);

  // tokenizer_2 is a SentencePiece model: BPE files are not its fields, and its model is required.
  std::string bpe = kFlux;
  bpe.replace(bpe.find("model: tokenizer/vocab.json"), 27, "vocab: tokenizer/vocab.json");
  ExpectInvalid(Parse(bpe), {"tokenizer_2.vocab"});
  ExpectInvalid(Parse(RemoveField(kFlux, "tokenizer_2.model")),
                {"field 'tokenizer_2.model' is required"});
  // The scheduler section is flow matching's: DDPM's betas are not its fields, nor ddim its
  // sampler; and DDPM kinds do not take a shift.
  std::string betas = kFlux;
  betas.replace(betas.find("  shift: 3.0"), 0, "  beta_start: 0.1\n");
  ExpectInvalid(Parse(betas), {"scheduler.beta_start"});
  std::string ddim = kFlux;
  ddim += "  scheduler: ddim\n";
  ExpectInvalid(Parse(ddim), {"defaults.scheduler"});
  ExpectInvalid(Parse(std::string(kMinimal) + "scheduler:\n  shift: 3.0\n"), {"scheduler.shift"});
  std::string seq = kFlux;
  seq.replace(seq.find("  base_shift"), 0, "  max_image_seq_len: 256\n");
  ExpectInvalid(Parse(seq), {"field 'scheduler.max_image_seq_len' must be > "
                             "scheduler.base_image_seq_len (256) (got 256)"});
}

// Kind hidream: four tokenizers, the third a SentencePiece model and the fourth an LLM's
// tokenizer.json with its pad token; other kinds may not have tokenizer_3 or tokenizer_4.
const char kHiDream[] = R"(kind: hidream
components:
  text_encoder: {file: text_encoder.pt}
  text_encoder_2: {file: text_encoder.pt}
  text_encoder_3: {file: text_encoder.pt}
  text_encoder_4: {file: text_encoder.pt}
  transformer: {file: unet.pt}
  vae_decoder: {file: vae_decoder.pt}
tokenizer:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
  max_length: 128
tokenizer_2:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
  max_length: 128
  pad_token: "!"
tokenizer_3:
  model: tokenizer/vocab.json
  max_length: 128
tokenizer_4:
  json: tokenizer/merges.txt
  max_length: 128
  pad_token: <|eot_id|>
scheduler:
  shift: 6.0
latent:
  channels: 16
  shift_factor: 0.1159
)";

TEST_F(ManifestTest, HiDreamManifestParsesFourTokenizers) {
  auto r = Parse(kHiDream);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->tokenizer_3.has_value() && r->tokenizer_4.has_value());
  EXPECT_EQ(r->tokenizer_3->model, dir_ + "/tokenizer/vocab.json");
  EXPECT_EQ(r->tokenizer_4->json, dir_ + "/tokenizer/merges.txt");
  EXPECT_EQ(r->tokenizer_4->pad_token, "<|eot_id|>");
  EXPECT_EQ(r->tokenizer_4->max_length, 128);
  EXPECT_EQ(r->Tokenizers().size(), 4u);
  EXPECT_EQ(r->tokenizer_4->Files(), std::vector<std::string>{dir_ + "/tokenizer/merges.txt"});

  ExpectInvalid(Parse(RemoveField(kHiDream, "tokenizer_4")), {"field 'tokenizer_4' is required"});
  ExpectInvalid(Parse(RemoveField(kHiDream, "tokenizer_4.pad_token")),
                {"field 'tokenizer_4.pad_token' is required"});
  ExpectInvalid(Parse(RemoveField(kHiDream, "tokenizer_4.json")),
                {"field 'tokenizer_4.json' is required"});
  std::string vocab = kHiDream;
  vocab.replace(vocab.find("json: tokenizer/merges.txt"), 26, "vocab: tokenizer/vocab.json");
  ExpectInvalid(Parse(vocab), {"tokenizer_4.vocab"});
  std::string missing = kHiDream;
  missing.replace(missing.find("json: tokenizer/merges.txt"), 26, "json: tokenizer/none.json");
  ExpectInvalid(Parse(missing), {"tokenizer_4.json"});
  ExpectInvalid(Parse(std::string(kFlux) + "tokenizer_3:\n  model: tokenizer/vocab.json\n"),
                {"field 'tokenizer_3' is not read by pipelines of kind 'flux'"});
}

// conditioning.padded_image_tokens: hidream's non-square padding, in its range, hidream's only.
TEST_F(ManifestTest, PaddedImageTokensAreHiDreamsAndBounded) {
  EXPECT_EQ(Parse(kHiDream)->conditioning.padded_image_tokens, 0);  // square images only
  const std::string padded = std::string(kHiDream) + "conditioning:\n  padded_image_tokens: ";
  auto r = Parse(padded + "4096\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->conditioning.padded_image_tokens, 4096);
  ExpectInvalid(Parse(padded + "-1\n"),
                {"field 'conditioning.padded_image_tokens' must be between 1 and 65536 (got -1)"});
  ExpectInvalid(Parse(padded + "70000\n"), {"must be between 1 and 65536 (got 70000)"});
  ExpectInvalid(Parse(padded + "4096.5\n"), {"conditioning.padded_image_tokens"});
  std::string sdxl = kSdxl;
  sdxl.replace(sdxl.find("conditioning:\n"), 14, "conditioning:\n  padded_image_tokens: 64\n");
  ExpectInvalid(Parse(sdxl), {"field 'conditioning.padded_image_tokens' is read by pipelines of "
                              "kind 'hidream' only, not 'sdxl'"});
}
}  // namespace
}  // namespace qpool::manifest_testing
