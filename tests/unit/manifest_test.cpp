// pipeline.yaml parsing and validation (docs/model-repository.md): values, defaults, and an error
// that names the file and the dotted field for missing and malformed sections (the per-rule
// messages are in manifest_rules_test.cpp).
#include <chrono>

#include "manifest_fixture.h"

namespace qpool::manifest_testing {
namespace {

const char kFull[] = R"(kind: sd
components:
  text_encoder:
    file: text_encoder.pt
    quantization:
      format: nf4
      blocksize: 128
      double_quant: true
      skip: [final_proj, "proj_out"]
  unet:
    file: ./unet.pt
    quantization:
      format: int8
      min_weights: 4194304
  vae_decoder:
    file: vae_decoder.pt
tokenizer:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
  max_length: 64
scheduler:
  num_train_timesteps: 500
  beta_start: 0.0001
  beta_end: 0.02
  beta_schedule: linear
  timestep_spacing: trailing
  steps_offset: 0
  prediction_type: epsilon
latent:
  channels: 16
  downscale: 16
  scaling_factor: 0.5
defaults:
  steps: 30
  guidance_scale: 5
  width: 256
  height: 384
  scheduler: euler
limits:
  max_steps: 50
  max_width: 768
  max_height: 640
  max_images: 2
  max_prompts: 8
  max_queue: 5
placement:
  device: cuda:1
  dtype: bfloat16
  replicas: 2
batching:
  max_batch: 8
  max_delay_ms: 12.5
execution:
  cuda_graphs: false
  max_graphs: 2
  warmup: true
)";

// Note [Compiled forward]: components.<name>.compiled names a package beside the component, the
// device type it was compiled for and, optionally, its digest; each field is checked by name.
TEST_F(ManifestTest, CompiledForwardIsParsedAndChecked) {
  WriteFile(dir_ + "/unet.cpu.pt2", "x");
  const std::string digest(64, 'd');
  auto r =
      Parse(Build(Parts().UnetExtra("    compiled:\n      file: unet.cpu.pt2\n"
                                    "      device: cpu\n      sha256: " +
                                    digest + "\n")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ComponentSpec* unet = r->FindComponent("unet");
  ASSERT_TRUE(unet->compiled.has_value());
  EXPECT_EQ(unet->compiled->file, dir_ + "/unet.cpu.pt2");
  EXPECT_EQ(unet->compiled->device, "cpu");
  EXPECT_EQ(unet->compiled->sha256, digest);
  EXPECT_FALSE(r->FindComponent("vae_decoder")->compiled.has_value());

  const std::string c = "    compiled:\n";
  struct Case {
    std::string extra;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {c + "      device: cpu\n", {"field 'components.unet.compiled.file' is required"}},
      {c + "      file: unet.cpu.pt2\n", {"field 'components.unet.compiled.device' is required"}},
      {c + "      file: unet.cpu.pt2\n      device: tpu\n",
       {"field 'components.unet.compiled.device' must be one of: cpu, cuda (got 'tpu')"}},
      {c + "      file: missing.pt2\n      device: cpu\n",
       {"field 'components.unet.compiled.file' names a file that does not exist"}},
      {c + "      file: ../unet.cpu.pt2\n      device: cpu\n",
       {"field 'components.unet.compiled.file' must not contain a '..' segment"}},
      {c + "      file: unet.cpu.pt2\n      device: cpu\n      sha256: abc\n",
       {"field 'components.unet.compiled.sha256' must be 64 lowercase hex digits"}},
      {c + "      file: unet.cpu.pt2\n      device: cpu\n      dtype: float16\n",
       {"field 'components.unet.compiled.dtype' is not a known field", "file, device, sha256"}},
      {"    compiled: unet.cpu.pt2\n", {"field 'components.unet.compiled' must be a mapping"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.extra);
    ExpectInvalid(Parse(Build(Parts().UnetExtra(k.extra))), k.expect);
  }
}

// Note [Weights beside the graph]: components.<name>.weights names the safetensors file of the
// component's tensors and, optionally, its digest.
TEST_F(ManifestTest, WeightsFileIsParsedAndChecked) {
  WriteFile(dir_ + "/unet.safetensors", "x");
  const std::string digest(64, 'e');
  auto r =
      Parse(Build(Parts().UnetExtra("    weights:\n      file: unet.safetensors\n"
                                    "      sha256: " +
                                    digest + "\n")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ComponentSpec* unet = r->FindComponent("unet");
  ASSERT_TRUE(unet->weights.has_value());
  EXPECT_EQ(unet->weights->file, dir_ + "/unet.safetensors");
  EXPECT_EQ(unet->weights->sha256, digest);
  EXPECT_FALSE(r->FindComponent("vae_decoder")->weights.has_value());

  const std::string w = "    weights:\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {w + "      sha256: " + digest + "\n", "field 'components.unet.weights.file' is required"},
      {w + "      file: missing.safetensors\n",
       "field 'components.unet.weights.file' names a file that does not exist"},
      {w + "      file: ../unet.safetensors\n",
       "field 'components.unet.weights.file' must not contain a '..' segment"},
      {w + "      file: unet.safetensors\n      sha256: abc\n",
       "field 'components.unet.weights.sha256' must be 64 lowercase hex digits"},
      {w + "      file: unet.safetensors\n      dtype: float16\n",
       "field 'components.unet.weights.dtype' is not a known field"},
      {"    weights: unet.safetensors\n", "field 'components.unet.weights' must be a mapping"},
  };
  for (const auto& [extra, expect] : cases) {
    SCOPED_TRACE(extra);
    ExpectInvalid(Parse(Build(Parts().UnetExtra(extra))), {expect});
  }
}

// Note [Files stay in the repository]: links within the repository are followed, links out of
// it refused, naming the field and where the link leads.
TEST_F(ManifestTest, SymlinksMayNotLeaveTheRepository) {
  const std::string repo = testing::MakeTempDir("manifest-repo");
  const std::string pipe = repo + "/p";
  for (const char* f : {"text_encoder.pt", "vae_decoder.pt", "tokenizer/vocab.json",
                        "tokenizer/merges.txt", "pipeline.yaml"}) {
    WriteFile(pipe + "/" + f, std::string(f) == "pipeline.yaml" ? kMinimal : "x");
  }
  WriteFile(repo + "/shared/unet.pt", "x");
  fs::create_symlink(repo + "/shared/unet.pt", pipe + "/unet.pt");
  auto inside = LoadManifest(pipe, testing::BuiltinKindCatalog());
  EXPECT_TRUE(inside.ok()) << inside.status().ToString();

  const std::string outside = testing::MakeTempDir("manifest-outside");
  WriteFile(outside + "/secret.pt", "x");
  fs::remove(pipe + "/unet.pt");
  fs::create_symlink(outside + "/secret.pt", pipe + "/unet.pt");
  auto out = LoadManifest(pipe, testing::BuiltinKindCatalog());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            pipe + "/pipeline.yaml: field 'components.unet.file' resolves to " + outside +
                "/secret.pt, outside the model repository " + repo +
                " (a symbolic link out of it is refused)");
  // A linked folder on the way counts too.
  fs::remove(pipe + "/unet.pt");
  WriteFile(pipe + "/unet.pt", "x");
  fs::remove_all(pipe + "/tokenizer");
  WriteFile(outside + "/tokenizer/vocab.json", "x");
  WriteFile(outside + "/tokenizer/merges.txt", "x");
  fs::create_symlink(outside + "/tokenizer", pipe + "/tokenizer");
  out = LoadManifest(pipe, testing::BuiltinKindCatalog());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("field 'tokenizer.vocab' resolves to " + outside +
                                        "/tokenizer/vocab.json, outside"),
            std::string::npos)
      << out.status().message();
  fs::remove_all(outside);
  fs::remove_all(repo);
}

TEST_F(ManifestTest, FullManifestParsesEveryValue) {
  WriteFile(path_, kFull);
  auto r = LoadManifest(dir_, testing::BuiltinKindCatalog());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const PipelineManifest& m = *r;
  EXPECT_EQ(m.name, fs::path(dir_).filename().string());
  EXPECT_EQ(m.kind, "sd");
  EXPECT_EQ(m.dir, dir_);
  EXPECT_EQ(m.path, path_);
  ASSERT_EQ(m.components.size(), 3u);
  EXPECT_EQ(m.components[0].name, "text_encoder");
  EXPECT_EQ(m.components[1].name, "unet");
  EXPECT_EQ(m.components[2].name, "vae_decoder");
  EXPECT_EQ(m.components[0].file, dir_ + "/text_encoder.pt");
  EXPECT_EQ(m.components[1].file, dir_ + "/unet.pt");  // "./unet.pt" normalized
  EXPECT_EQ(m.components[2].file, dir_ + "/vae_decoder.pt");
  const QuantizationSpec& te = m.components[0].quantization;
  EXPECT_EQ(te.format, "nf4");
  EXPECT_EQ(te.blocksize, 128);
  EXPECT_TRUE(te.double_quant);
  EXPECT_EQ(te.skip, (std::vector<std::string>{"final_proj", "proj_out"}));
  EXPECT_EQ(te.min_weights, 0);
  EXPECT_EQ(m.components[1].quantization.format, "int8");
  EXPECT_EQ(m.components[1].quantization.min_weights, 4194304);
  EXPECT_FALSE(m.components[1].quantization.double_quant);
  EXPECT_EQ(m.components[2].quantization.format, "none");
  EXPECT_EQ(m.tokenizer.vocab, dir_ + "/tokenizer/vocab.json");
  EXPECT_EQ(m.tokenizer.merges, dir_ + "/tokenizer/merges.txt");
  EXPECT_EQ(m.tokenizer.max_length, 64);
  EXPECT_EQ(m.scheduler.num_train_timesteps, 500);
  EXPECT_DOUBLE_EQ(m.scheduler.beta_start, 0.0001);
  EXPECT_DOUBLE_EQ(m.scheduler.beta_end, 0.02);
  EXPECT_EQ(m.scheduler.beta_schedule, "linear");
  EXPECT_EQ(m.scheduler.timestep_spacing, "trailing");
  EXPECT_EQ(m.scheduler.steps_offset, 0);
  EXPECT_EQ(m.scheduler.prediction_type, "epsilon");
  EXPECT_EQ(m.latent.channels, 16);
  EXPECT_EQ(m.latent.downscale, 16);
  EXPECT_DOUBLE_EQ(m.latent.scaling_factor, 0.5);
  EXPECT_EQ(m.defaults.steps, 30);
  EXPECT_DOUBLE_EQ(m.defaults.guidance_scale, 5.0);
  EXPECT_EQ(m.defaults.width, 256);
  EXPECT_EQ(m.defaults.height, 384);
  EXPECT_EQ(m.defaults.scheduler, "euler");
  EXPECT_EQ(m.limits.max_steps, 50);
  EXPECT_EQ(m.limits.max_width, 768);
  EXPECT_EQ(m.limits.max_height, 640);
  EXPECT_EQ(m.limits.max_images, 2);
  EXPECT_EQ(m.limits.max_prompts, 8);
  EXPECT_EQ(m.limits.max_queue, 5);
  EXPECT_EQ(m.placement.device, "cuda:1");
  EXPECT_EQ(m.placement.dtype, "bfloat16");
  EXPECT_EQ(m.placement.replicas, 2);
  EXPECT_EQ(m.batching.max_batch, 8);
  EXPECT_DOUBLE_EQ(m.batching.max_delay_ms, 12.5);
  EXPECT_FALSE(m.execution.cuda_graphs);
  EXPECT_EQ(m.execution.max_graphs, 2);
  EXPECT_TRUE(m.execution.warmup);
  ASSERT_NE(m.FindComponent("unet"), nullptr);
  EXPECT_EQ(m.FindComponent("unet")->file, dir_ + "/unet.pt");
  EXPECT_EQ(m.FindComponent("refiner"), nullptr);
}

TEST_F(ManifestTest, MinimalManifestGetsEveryDefault) {
  auto r = Parse(kMinimal);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const PipelineManifest& m = *r;
  ASSERT_EQ(m.components.size(), 3u);
  for (const auto& c : m.components) {
    EXPECT_EQ(c.quantization.format, "none");
    EXPECT_EQ(c.quantization.blocksize, 64);
    EXPECT_FALSE(c.quantization.double_quant);
    EXPECT_TRUE(c.quantization.skip.empty());
  }
  EXPECT_EQ(m.tokenizer.max_length, 77);
  EXPECT_EQ(m.scheduler.num_train_timesteps, 1000);
  EXPECT_DOUBLE_EQ(m.scheduler.beta_start, 0.00085);
  EXPECT_DOUBLE_EQ(m.scheduler.beta_end, 0.012);
  EXPECT_EQ(m.scheduler.beta_schedule, "scaled_linear");
  EXPECT_EQ(m.scheduler.timestep_spacing, "leading");
  EXPECT_EQ(m.scheduler.steps_offset, 1);
  EXPECT_EQ(m.scheduler.prediction_type, "epsilon");
  EXPECT_EQ(m.latent.channels, 4);
  EXPECT_EQ(m.latent.downscale, 8);
  EXPECT_DOUBLE_EQ(m.latent.scaling_factor, 0.18215);
  EXPECT_EQ(m.defaults.steps, 20);
  EXPECT_DOUBLE_EQ(m.defaults.guidance_scale, 7.5);
  EXPECT_EQ(m.defaults.width, 512);
  EXPECT_EQ(m.defaults.height, 512);
  EXPECT_EQ(m.defaults.scheduler, "ddim");
  EXPECT_EQ(m.limits.max_steps, 150);
  EXPECT_EQ(m.limits.max_width, 1024);
  EXPECT_EQ(m.limits.max_height, 1024);
  EXPECT_EQ(m.limits.max_images, 4);
  EXPECT_EQ(m.limits.max_prompts, 16);
  EXPECT_EQ(m.limits.max_queue, 32);
  EXPECT_EQ(m.placement.device, "auto");
  EXPECT_EQ(m.placement.dtype, "auto");
  EXPECT_EQ(m.placement.replicas, 1);
  EXPECT_EQ(m.placement.max_replicas, 1) << "no scale-out unless asked for";
  EXPECT_EQ(m.batching.max_batch, 1) << "batching is off unless the manifest asks for it";
  EXPECT_DOUBLE_EQ(m.batching.max_delay_ms, 0);
  EXPECT_TRUE(m.execution.cuda_graphs) << "the denoiser replays CUDA graphs unless turned off";
  EXPECT_EQ(m.execution.max_graphs, 4);
  EXPECT_FALSE(m.execution.warmup) << "a load makes no image unless asked to";
}

TEST_F(ManifestTest, EmptyOptionalSectionsGetDefaults) {
  auto r =
      Parse(std::string(kMinimal) + "scheduler:\nlatent:\ndefaults: {}\nlimits:\nplacement:\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->defaults.width, 512);
  EXPECT_EQ(r->placement.device, "auto");
}

// A "billion laughs" of aliases expands exponentially: refused from the event stream, unexpanded,
// in a moment (it took seconds and GBs per parse; Note [Manifests without aliases]).
TEST_F(ManifestTest, AliasesAreRefusedWithoutExpandingThem) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  std::string prev = "a";
  for (char c = 'b'; c <= 'z'; ++c) {
    bomb += std::string(1, c) + ": &" + c + " [*" + prev + ", *" + prev + ", *" + prev + ", *" +
            prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n";
    prev = std::string(1, c);
  }
  const auto start = std::chrono::steady_clock::now();
  auto r = Parse("kind: sd\n" + bomb);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ExpectInvalid(r, {"line 3", "YAML aliases (*name) are not accepted"});
}

// Texts on which yaml-cpp's event parser reported documents forever (found by fuzz_manifest): the
// alias check hung, and with it every ListPipelines. Each is refused at once.
TEST_F(ManifestTest, TextsThatOnceHungTheAliasCheckAreRefusedAtOnce) {
  for (const std::string text : {std::string(","), std::string("\0,(", 3), std::string("!k, "),
                                 std::string(",Jk[ids[xl\n")}) {
    const auto start = std::chrono::steady_clock::now();
    auto r = Parse(text);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(ManifestTest, OversizedManifestsAreRefused) {
  std::string big = "kind: sd\n# " + std::string(kMaxManifestBytes, 'x') + "\n";
  ExpectInvalid(Parse(big), {"bytes; a manifest may have at most 65536"});
  WriteFile(path_, big);
  ExpectInvalid(LoadManifest(dir_, testing::BuiltinKindCatalog()),
                {"bytes; a manifest may have at most 65536"});
}

TEST_F(ManifestTest, ComponentsKeepExecutionOrderWhateverTheFileOrder) {
  auto r = Parse(R"(kind: sd
tokenizer: {vocab: tokenizer/vocab.json, merges: tokenizer/merges.txt}
components:
  vae_decoder: {file: vae_decoder.pt}
  unet: {file: unet.pt}
  text_encoder: {file: text_encoder.pt}
)");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->components.size(), 3u);
  EXPECT_EQ(r->components[0].name, "text_encoder");
  EXPECT_EQ(r->components[1].name, "unet");
  EXPECT_EQ(r->components[2].name, "vae_decoder");
}

TEST_F(ManifestTest, EveryRequiredFieldIsReportedWhenMissing) {
  const std::vector<std::string> required = {"kind",
                                             "components",
                                             "components.text_encoder",
                                             "components.text_encoder.file",
                                             "components.unet",
                                             "components.unet.file",
                                             "components.vae_decoder",
                                             "components.vae_decoder.file",
                                             "tokenizer",
                                             "tokenizer.vocab",
                                             "tokenizer.merges"};
  for (const auto& field : required) {
    SCOPED_TRACE(field);
    const std::string text = RemoveField(kFull, field);
    ASSERT_NE(text, kFull);
    ExpectInvalid(Parse(text), {"field '" + field + "' is required"});
    // Same from disk.
    WriteFile(path_, text);
    ExpectInvalid(LoadManifest(dir_, testing::BuiltinKindCatalog()),
                  {"field '" + field + "' is required"});
  }
}

TEST_F(ManifestTest, RequiredFieldWithEmptyValueIsReported) {
  ExpectInvalid(Parse(Build(Parts().Kind(""))), {"field 'kind' is required"});
  ExpectInvalid(Parse(Build(Parts().UnetFile(""))), {"field 'components.unet.file' is required"});
  ExpectInvalid(Parse(Build(Parts().UnetFile("''"))), {"'components.unet.file' must not be empty"});
}

TEST_F(ManifestTest, SectionsMustBeMappings) {
  ExpectInvalid(Parse(R"(kind: sd
components:
  text_encoder: text_encoder.pt
)"),
                {"field 'components.text_encoder' must be a mapping (got 'text_encoder.pt')"});
  ExpectInvalid(Parse("kind: sd\ncomponents: [unet]\n"),
                {"field 'components' must be a mapping (got a list)"});
  ExpectInvalid(Parse(std::string(kMinimal) + "limits: [1]\n"),
                {"field 'limits' must be a mapping (got a list)"});
}

TEST_F(ManifestTest, MissingFileReportsTheResolvedPath) {
  fs::remove(dir_ + "/tokenizer/merges.txt");
  ExpectInvalid(Parse(kMinimal), {"field 'tokenizer.merges' names a file that does not exist: " +
                                  dir_ + "/tokenizer/merges.txt"});
  ExpectInvalid(Parse(Build(Parts().UnetFile("sub/./x.pt"))),
                {"does not exist: " + dir_ + "/sub/x.pt"});
}

TEST_F(ManifestTest, ValidVariantsAreAccepted) {
  for (const std::string device :
       {"auto", "cpu", "cuda", "cuda:0", "cuda:12", "cuda:0,cuda:1", "cuda:3,cuda:1,cuda:2"}) {
    auto r = Parse(Build(Parts().Extra("placement:\n  device: \"" + device + "\"\n")));
    ASSERT_TRUE(r.ok()) << device << ": " << r.status().ToString();
    EXPECT_EQ(r->placement.device, device);
  }
  {
    auto r = Parse(Build(Parts().Extra("placement:\n  replicas: all\n")));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->placement.replicas, 0) << "all = one per allowed device";
    EXPECT_EQ(r->placement.max_replicas, 0) << "no more than one per device";
  }
  {
    auto r = Parse(Build(Parts().Extra("placement:\n  max_replicas: all\n")));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->placement.replicas, 1);
    EXPECT_EQ(r->placement.max_replicas, 0) << "scale out to every allowed device";
  }
  for (const std::string dtype : {"auto", "float32", "float16", "bfloat16"}) {
    auto r = Parse(Build(Parts().Extra("placement:\n  dtype: " + dtype + "\n")));
    ASSERT_TRUE(r.ok()) << dtype << ": " << r.status().ToString();
    EXPECT_EQ(r->placement.dtype, dtype);
  }
  for (int bs : {16, 64, 4096}) {
    auto r = Parse(Build(Parts().UnetExtra(
        "    quantization: {format: nf4, blocksize: " + std::to_string(bs) + "}\n")));
    ASSERT_TRUE(r.ok()) << bs << ": " << r.status().ToString();
    EXPECT_EQ(r->FindComponent("unet")->quantization.blocksize, bs);
  }
  // Limits at their bounds, an integer where a number is expected, false double_quant on int8.
  auto r = Parse(Build(Parts()
                           .UnetExtra("    quantization: {format: int8, double_quant: false}\n")
                           .TokenizerExtra("  max_length: 1024\n")
                           .Extra("defaults: {steps: 150, width: 1024, height: 8, "
                                  "guidance_scale: 0}\n")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokenizer.max_length, 1024);
  EXPECT_EQ(r->defaults.steps, 150);
  EXPECT_DOUBLE_EQ(r->defaults.guidance_scale, 0.0);
}

TEST_F(ManifestTest, YamlSyntaxErrorNamesLineAndColumn) {
  ExpectInvalid(Parse("kind: sd\ncomponents:\n  unet: [unclosed\n"),
                {"invalid YAML at line ", "column"});
  ExpectInvalid(Parse("kind: sd\n  bad: x\n"), {"invalid YAML at line 2, column"});
}

TEST_F(ManifestTest, TopLevelMustBeAMapping) {
  ExpectInvalid(Parse("- kind\n- sd\n"), {"top level must be a mapping", "(got a list)"});
  ExpectInvalid(Parse(""), {"top level must be a mapping", "(got an empty value)"});
  ExpectInvalid(Parse("sd\n"), {"top level must be a mapping", "(got 'sd')"});
  ExpectInvalid(Parse(std::string(kMinimal) + "---\nkind: sd\n"), {"more than one YAML document"});
}

TEST_F(ManifestTest, LoadReportsMissingManifestAsNotFound) {
  auto r = LoadManifest(dir_, testing::BuiltinKindCatalog());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message().rfind(path_ + ": ", 0), 0u) << r.status().message();

  auto missing_dir = LoadManifest(dir_ + "/nope", testing::BuiltinKindCatalog());
  EXPECT_EQ(missing_dir.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing_dir.status().message().find(dir_ + "/nope/pipeline.yaml"), std::string::npos);
}

TEST_F(ManifestTest, DirectoryIsNormalized) {
  WriteFile(path_, kMinimal);
  auto r = LoadManifest(dir_ + "/./", testing::BuiltinKindCatalog());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->dir, dir_);
  EXPECT_EQ(r->path, path_);
  EXPECT_EQ(r->name, fs::path(dir_).filename().string());
  EXPECT_EQ(r->components[1].file, dir_ + "/unet.pt");
}

}  // namespace
}  // namespace qpool::manifest_testing
