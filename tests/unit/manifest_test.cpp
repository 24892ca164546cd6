// pipeline.yaml parsing and validation (docs/model-repository.md): values, defaults, and an error
// that names the file and the dotted field for every rule.
#include "config/manifest.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include "testing/test_paths.h"

namespace qpool {
namespace {

namespace fs = std::filesystem;
using ::qpool::testing::MakeTempDir;
using ::qpool::testing::WriteFile;

const char kMinimal[] = R"(kind: sd
components:
  text_encoder:
    file: text_encoder.pt
  unet:
    file: unet.pt
  vae_decoder:
    file: vae_decoder.pt
tokenizer:
  vocab: tokenizer/vocab.json
  merges: tokenizer/merges.txt
)";

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
placement:
  device: cuda:1
  dtype: bfloat16
)";

// Pieces of a manifest that validation cases change; everything else is the minimal manifest.
struct Parts {
  std::string kind = "sd";
  std::string unet_file = "unet.pt";
  std::string unet_extra;        // lines under components.unet (4-space indent)
  std::string components_extra;  // lines under components (2-space indent)
  std::string tokenizer_extra;   // lines under tokenizer (2-space indent)
  std::string extra;             // top-level sections

  Parts& Kind(std::string v) { return Set(&kind, std::move(v)); }
  Parts& UnetFile(std::string v) { return Set(&unet_file, std::move(v)); }
  Parts& UnetExtra(std::string v) { return Set(&unet_extra, std::move(v)); }
  Parts& ComponentsExtra(std::string v) { return Set(&components_extra, std::move(v)); }
  Parts& TokenizerExtra(std::string v) { return Set(&tokenizer_extra, std::move(v)); }
  Parts& Extra(std::string v) { return Set(&extra, std::move(v)); }

 private:
  Parts& Set(std::string* field, std::string v) {
    *field = std::move(v);
    return *this;
  }
};

std::string Build(const Parts& p) {
  return "kind: " + p.kind + "\ncomponents:\n  text_encoder:\n    file: text_encoder.pt\n" +
         "  unet:\n    file: " + p.unet_file + "\n" + p.unet_extra +
         "  vae_decoder:\n    file: vae_decoder.pt\n" + p.components_extra +
         "tokenizer:\n  vocab: tokenizer/vocab.json\n  merges: tokenizer/merges.txt\n" +
         p.tokenizer_extra + p.extra;
}

// Removes the line of `dotted` (2-space indentation) and every line nested under it.
std::string RemoveField(const std::string& yaml, const std::string& dotted) {
  std::istringstream in(yaml);
  std::string line, out;
  std::vector<std::string> path;  // key per indentation level
  int removing_indent = -1;
  while (std::getline(in, line)) {
    const int indent = static_cast<int>(line.find_first_not_of(' '));
    if (removing_indent >= 0 && indent > removing_indent) continue;
    removing_indent = -1;
    const std::string key = line.substr(indent, line.find(':') - indent);
    path.resize(indent / 2);
    path.push_back(key);
    std::string joined;
    for (const auto& k : path) joined += (joined.empty() ? "" : ".") + k;
    if (joined == dotted) {
      removing_indent = indent;
      continue;
    }
    out += line + "\n";
  }
  return out;
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("manifest");
    for (const char* f : {"text_encoder.pt", "unet.pt", "vae_decoder.pt", "tokenizer/vocab.json",
                          "tokenizer/merges.txt"}) {
      WriteFile(dir_ + "/" + f, "x");
    }
    path_ = dir_ + "/pipeline.yaml";
  }
  void TearDown() override { fs::remove_all(dir_); }

  StatusOr<PipelineManifest> Parse(const std::string& text) { return ParseManifest(text, dir_); }

  // The status is InvalidArgument, starts with the manifest path and holds every substring.
  void ExpectInvalid(const StatusOr<PipelineManifest>& r, const std::vector<std::string>& parts) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_EQ(r.status().message().rfind(path_ + ": ", 0), 0u) << r.status().message();
    for (const auto& part : parts) {
      EXPECT_NE(r.status().message().find(part), std::string::npos)
          << "expected '" << part << "' in: " << r.status().message();
    }
  }

  std::string dir_;
  std::string path_;
};

TEST_F(ManifestTest, FullManifestParsesEveryValue) {
  WriteFile(path_, kFull);
  auto r = LoadManifest(dir_);
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
  EXPECT_EQ(m.components[1].quantization.format, "int8");
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
  EXPECT_EQ(m.placement.device, "cuda:1");
  EXPECT_EQ(m.placement.dtype, "bfloat16");
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
  EXPECT_EQ(m.placement.device, "auto");
  EXPECT_EQ(m.placement.dtype, "auto");
}

TEST_F(ManifestTest, EmptyOptionalSectionsGetDefaults) {
  auto r =
      Parse(std::string(kMinimal) + "scheduler:\nlatent:\ndefaults: {}\nlimits:\nplacement:\n");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->defaults.width, 512);
  EXPECT_EQ(r->placement.device, "auto");
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
  EXPECT_EQ(RequiredComponents("sd"),
            (std::vector<std::string>{"text_encoder", "unet", "vae_decoder"}));
  EXPECT_TRUE(RequiredComponents("flux").empty());
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
    ExpectInvalid(LoadManifest(dir_), {"field '" + field + "' is required"});
  }
}

TEST_F(ManifestTest, RequiredFieldWithEmptyValueIsReported) {
  ExpectInvalid(Parse(Build(Parts().Kind(""))), {"field 'kind' is required"});
  ExpectInvalid(Parse(Build(Parts().UnetFile(""))), {"field 'components.unet.file' is required"});
  ExpectInvalid(Parse(Build(Parts().UnetFile("''"))), {"'components.unet.file' must not be empty"});
}

struct Case {
  const char* name;
  Parts parts;
  std::vector<std::string> expect;
};

TEST_F(ManifestTest, EachRuleGivesASpecificMessage) {
  const std::string q = "    quantization:\n";
  const std::vector<Case> cases = {
      // kind and components
      {"unknown kind", Parts().Kind("sdxl"), {"field 'kind'", "'sdxl'", "supported: sd"}},
      {"kind type", Parts().Kind("[sd]"), {"field 'kind' must be a string (got a list)"}},
      {"unknown component",
       Parts().ComponentsExtra("  refiner:\n    file: unet.pt\n"),
       {"field 'components.refiner' is not a component of kind 'sd'",
        "text_encoder, unet, vae_decoder"}},
      {"component unknown key",
       Parts().UnetExtra("    flie: x\n"),
       {"field 'components.unet.flie' is not a known field", "file, quantization"}},
      {"duplicate component",
       Parts().ComponentsExtra("  vae_decoder: {file: unet.pt}\n"),
       {"field 'components.vae_decoder' appears more than once"}},
      // files
      {"absolute path",
       Parts().UnetFile("/etc/passwd"),
       {"field 'components.unet.file' must be a path relative to the pipeline folder",
        "'/etc/passwd'"}},
      {"dotdot",
       Parts().UnetFile("../unet.pt"),
       {"field 'components.unet.file' must not contain a '..' segment", "'../unet.pt'"}},
      {"inner dotdot", Parts().UnetFile("tokenizer/../unet.pt"), {"'..' segment"}},
      {"missing file",
       Parts().UnetFile("weights/missing.pt"),
       {"field 'components.unet.file' names a file that does not exist: "}},
      {"directory", Parts().UnetFile("tokenizer"), {"is not a regular file"}},
      // quantization
      {"format",
       Parts().UnetExtra(q + "      format: fp8\n"),
       {"field 'components.unet.quantization.format' must be one of: none, int8, nf4 (got 'fp8')"}},
      {"blocksize not power of two",
       Parts().UnetExtra(q + "      format: nf4\n      blocksize: 48\n"),
       {"field 'components.unet.quantization.blocksize' must be a power of two between 16 and "
        "4096 (got 48)"}},
      {"blocksize too small",
       Parts().UnetExtra(q + "      format: nf4\n      blocksize: 8\n"),
       {"blocksize' must be a power of two", "(got 8)"}},
      {"blocksize too large",
       Parts().UnetExtra(q + "      format: nf4\n      blocksize: 8192\n"),
       {"(got 8192)"}},
      {"blocksize for int8",
       Parts().UnetExtra(q + "      format: int8\n      blocksize: 64\n"),
       {"field 'components.unet.quantization.blocksize' applies to format nf4 only"}},
      {"double_quant for int8",
       Parts().UnetExtra(q + "      format: int8\n      double_quant: true\n"),
       {"field 'components.unet.quantization.double_quant' applies to format nf4 only", "'int8'"}},
      {"double_quant for none",
       Parts().UnetExtra(q + "      double_quant: true\n"),
       {"double_quant' applies to format nf4 only", "'none'"}},
      {"double_quant type",
       Parts().UnetExtra(q + "      format: nf4\n      double_quant: maybe\n"),
       {"field 'components.unet.quantization.double_quant' must be a boolean", "'maybe'"}},
      {"skip type",
       Parts().UnetExtra(q + "      skip: final_proj\n"),
       {"field 'components.unet.quantization.skip' must be a list of strings"}},
      {"skip item type",
       Parts().UnetExtra(q + "      skip: [[a]]\n"),
       {"field 'components.unet.quantization.skip[0]' must be a string (got a list)"}},
      {"quantization unknown key",
       Parts().UnetExtra(q + "      fromat: nf4\n"),
       {"field 'components.unet.quantization.fromat' is not a known field"}},
      {"quantization type",
       Parts().UnetExtra("    quantization: nf4\n"),
       {"field 'components.unet.quantization' must be a mapping (got 'nf4')"}},
      // tokenizer
      {"max_length small",
       Parts().TokenizerExtra("  max_length: 1\n"),
       {"field 'tokenizer.max_length' must be between 2 and 1024 (got 1)"}},
      {"max_length large", Parts().TokenizerExtra("  max_length: 1025\n"), {"(got 1025)"}},
      {"tokenizer unknown key",
       Parts().TokenizerExtra("  merge: x\n"),
       {"field 'tokenizer.merge' is not a known field"}},
      // types
      {"int type",
       Parts().Extra("defaults:\n  steps: twenty\n"),
       {"field 'defaults.steps' must be an integer (got 'twenty')"}},
      {"quoted int",
       Parts().Extra("defaults:\n  steps: \"20\"\n"),
       {"field 'defaults.steps' must be an integer (got the quoted string '20')"}},
      {"fractional int",
       Parts().Extra("defaults:\n  steps: 20.5\n"),
       {"'defaults.steps' must be an integer (got '20.5')"}},
      {"int out of range",
       Parts().Extra("limits:\n  max_steps: 99999999999\n"),
       {"'limits.max_steps' is out of range"}},
      {"number type",
       Parts().Extra("defaults:\n  guidance_scale: high\n"),
       {"field 'defaults.guidance_scale' must be a number (got 'high')"}},
      {"number nan",
       Parts().Extra("defaults:\n  guidance_scale: .nan\n"),
       {"'defaults.guidance_scale' must be a number"}},
      {"string type",
       Parts().Extra("placement:\n  dtype: {a: 1}\n"),
       {"field 'placement.dtype' must be a string (got a mapping)"}},
      {"empty optional value",
       Parts().Extra("defaults:\n  steps:\n"),
       {"field 'defaults.steps' must be an integer (got an empty value)"}},
      {"section type",
       Parts().Extra("defaults: 5\n"),
       {"field 'defaults' must be a mapping (got '5')"}},
      // unknown keys and duplicates
      {"unknown top-level key",
       Parts().Extra("stepz: 3\n"),
       {"field 'stepz' is not a known field (expected one of: kind, components, tokenizer"}},
      {"unknown defaults key",
       Parts().Extra("defaults:\n  stpes: 3\n"),
       {"field 'defaults.stpes' is not a known field", "steps, guidance_scale"}},
      {"duplicate key",
       Parts().Extra("defaults:\n  steps: 10\n  steps: 12\n"),
       {"field 'defaults.steps' appears more than once"}},
      // scheduler
      {"beta_schedule",
       Parts().Extra("scheduler:\n  beta_schedule: cosine\n"),
       {"field 'scheduler.beta_schedule' must be one of: scaled_linear, linear (got 'cosine')"}},
      {"timestep_spacing",
       Parts().Extra("scheduler:\n  timestep_spacing: random\n"),
       {"field 'scheduler.timestep_spacing' must be one of: leading, linspace, trailing"}},
      {"prediction_type",
       Parts().Extra("scheduler:\n  prediction_type: v_prediction\n"),
       {"field 'scheduler.prediction_type' must be one of: epsilon (got 'v_prediction')"}},
      {"num_train_timesteps",
       Parts().Extra("scheduler:\n  num_train_timesteps: 0\n"),
       {"field 'scheduler.num_train_timesteps' must be >= 1 (got 0)"}},
      {"beta_start zero",
       Parts().Extra("scheduler:\n  beta_start: 0\n"),
       {"field 'scheduler.beta_start' must be > 0 and < 1 (got 0)"}},
      {"beta_start above beta_end",
       Parts().Extra("scheduler:\n  beta_start: 0.02\n"),
       {"field 'scheduler.beta_end' must be > scheduler.beta_start (0.02) and < 1 (got 0.012)"}},
      {"beta_end one",
       Parts().Extra("scheduler:\n  beta_end: 1.0\n"),
       {"field 'scheduler.beta_end'", "(got 1)"}},
      {"steps_offset",
       Parts().Extra("scheduler:\n  steps_offset: -1\n"),
       {"field 'scheduler.steps_offset' must be >= 0 (got -1)"}},
      {"steps_offset large",
       Parts().Extra("scheduler:\n  steps_offset: 1000\n"),
       {"field 'scheduler.steps_offset' must be < scheduler.num_train_timesteps (1000)"}},
      // latent
      {"channels",
       Parts().Extra("latent:\n  channels: 0\n"),
       {"field 'latent.channels' must be >= 1 (got 0)"}},
      {"downscale",
       Parts().Extra("latent:\n  downscale: 0\n"),
       {"field 'latent.downscale' must be >= 1 (got 0)"}},
      {"scaling_factor",
       Parts().Extra("latent:\n  scaling_factor: -0.1\n"),
       {"field 'latent.scaling_factor' must be > 0 (got -0.1)"}},
      // limits
      {"max_steps",
       Parts().Extra("limits:\n  max_steps: 0\n"),
       {"field 'limits.max_steps' must be >= 1 (got 0)"}},
      {"max_width",
       Parts().Extra("limits:\n  max_width: -8\n"),
       {"field 'limits.max_width' must be >= 1 (got -8)"}},
      {"max_height", Parts().Extra("limits:\n  max_height: 0\n"), {"field 'limits.max_height'"}},
      {"max_images", Parts().Extra("limits:\n  max_images: 0\n"), {"field 'limits.max_images'"}},
      {"max_prompts", Parts().Extra("limits:\n  max_prompts: 0\n"), {"field 'limits.max_prompts'"}},
      {"max_steps beyond training",
       Parts().Extra("limits:\n  max_steps: 1001\n"),
       {"field 'limits.max_steps' must be <= scheduler.num_train_timesteps (1000) (got 1001)"}},
      // defaults
      {"steps zero",
       Parts().Extra("defaults:\n  steps: 0\n"),
       {"field 'defaults.steps' must be between 1 and limits.max_steps (150) (got 0)"}},
      {"steps above limit",
       Parts().Extra("defaults:\n  steps: 30\nlimits:\n  max_steps: 25\n"),
       {"field 'defaults.steps' must be between 1 and limits.max_steps (25) (got 30)"}},
      {"guidance negative",
       Parts().Extra("defaults:\n  guidance_scale: -1\n"),
       {"field 'defaults.guidance_scale' must be >= 0 (got -1)"}},
      {"width multiple",
       Parts().Extra("defaults:\n  width: 100\n"),
       {"field 'defaults.width' must be a multiple of 8", "(got 100)"}},
      {"height multiple of downscale",
       Parts().Extra("latent:\n  downscale: 16\ndefaults:\n  height: 520\n"),
       {"field 'defaults.height' must be a multiple of 16", "(got 520)"}},
      {"width above limit",
       Parts().Extra("defaults:\n  width: 2048\n"),
       {"field 'defaults.width' must be between latent.downscale (8) and limits.max_width (1024) "
        "(got 2048)"}},
      {"height below downscale",
       Parts().Extra("defaults:\n  height: 4\n"),
       {"field 'defaults.height' must be between latent.downscale (8)", "(got 4)"}},
      {"default scheduler",
       Parts().Extra("defaults:\n  scheduler: pndm\n"),
       {"field 'defaults.scheduler' must be one of: ddim, euler (got 'pndm')"}},
      // placement
      {"device gpu",
       Parts().Extra("placement:\n  device: gpu\n"),
       {"field 'placement.device' must be auto, cpu, cuda or cuda:N (got 'gpu')"}},
      {"device cuda:", Parts().Extra("placement:\n  device: \"cuda:\"\n"), {"(got 'cuda:')"}},
      {"device cuda:x", Parts().Extra("placement:\n  device: cuda:x\n"), {"(got 'cuda:x')"}},
      {"device cuda:-1", Parts().Extra("placement:\n  device: cuda:-1\n"), {"(got 'cuda:-1')"}},
      {"dtype",
       Parts().Extra("placement:\n  dtype: int8\n"),
       {"field 'placement.dtype' must be one of: auto, float32, float16, bfloat16 (got 'int8')"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectInvalid(Parse(Build(c.parts)), c.expect);
  }
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
  for (const std::string device : {"auto", "cpu", "cuda", "cuda:0", "cuda:12"}) {
    auto r = Parse(Build(Parts().Extra("placement:\n  device: \"" + device + "\"\n")));
    ASSERT_TRUE(r.ok()) << device << ": " << r.status().ToString();
    EXPECT_EQ(r->placement.device, device);
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
  ExpectInvalid(Parse(std::string(kMinimal) + "---\nkind: sd\n"), {"2 YAML documents"});
}

TEST_F(ManifestTest, LoadReportsMissingManifestAsNotFound) {
  auto r = LoadManifest(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message().rfind(path_ + ": ", 0), 0u) << r.status().message();

  auto missing_dir = LoadManifest(dir_ + "/nope");
  EXPECT_EQ(missing_dir.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing_dir.status().message().find(dir_ + "/nope/pipeline.yaml"), std::string::npos);
}

TEST_F(ManifestTest, DirectoryIsNormalized) {
  WriteFile(path_, kMinimal);
  auto r = LoadManifest(dir_ + "/./");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->dir, dir_);
  EXPECT_EQ(r->path, path_);
  EXPECT_EQ(r->name, fs::path(dir_).filename().string());
  EXPECT_EQ(r->components[1].file, dir_ + "/unet.pt");
}

}  // namespace
}  // namespace qpool
