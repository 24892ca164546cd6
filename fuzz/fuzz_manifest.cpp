// fuzz_manifest: arbitrary text as a pipeline.yaml, through ParseManifest as the model repository
// parses it (YAML, the alias and size guards, every section's checks, the file checks against a
// real pipeline folder). Errors are fine; a crash, a hang, a leak or unbounded memory is not. An
// error must be INVALID_ARGUMENT naming the manifest (Note [Manifest errors name the file and the
// field]); a manifest that parses must hold values inside its documented ranges, and drives request
// resolution (ResolveGenerateRequest) as a pipeline of its kind would.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/manifest.h"
#include "fuzz_check.h"
#include "pipeline/generate_request.h"
#include "testing/kind_catalog.h"

namespace fs = std::filesystem;

namespace qpool::fuzz {
namespace {

// A model repository in a temporary folder with one pipeline folder, "tiny", holding every file the
// seed manifests name (empty files: the parser checks that they exist, not what they hold), so
// that parses get past components and tokenizers to the sections after them. Removed at exit.
class Repository {
 public:
  Repository() {
    std::string pattern = (fs::temp_directory_path() / "qpool-fuzz-manifest-XXXXXX").string();
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp");
    root_ = pattern;
    dir_ = root_ + "/tiny";
    for (const char* file :
         {"text_encoder.pt", "text_encoder_2.pt", "unet.pt", "vae_decoder.pt", "transformer.pt",
          "tokenizer/vocab.json", "tokenizer/merges.txt", "tokenizer_2/vocab.json",
          "tokenizer_2/merges.txt", "tokenizer_2/spiece.model"}) {
      const fs::path path = fs::path(dir_) / file;
      fs::create_directories(path.parent_path());
      std::ofstream(path) << "x";
    }
  }
  ~Repository() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  const std::string& pipeline_dir() const { return dir_; }

 private:
  std::string root_;
  std::string dir_;
};

bool IsPositiveMultiple(int value, int of) { return of >= 1 && value >= of && value % of == 0; }

// What a parsed manifest promises (manifest.h, docs/model-repository.md).
void CheckManifest(const PipelineManifest& m, const KindCatalog& kinds) {
  const auto kind = kinds.find(m.kind);
  FUZZ_CHECK(kind != kinds.end(), "unknown kind '" + m.kind + "' accepted");
  const KindManifestSpec& spec = kind->second;
  FUZZ_CHECK(m.components.size() == spec.components.size(), "components of kind " + m.kind);
  for (size_t i = 0; i < m.components.size(); ++i) {
    FUZZ_CHECK(m.components[i].name == spec.components[i], "component order");
    FUZZ_CHECK(StartsWith(m.components[i].file, m.dir + "/"), "file outside the pipeline folder");
  }
  FUZZ_CHECK(m.tokenizer.max_length >= 2 && m.tokenizer.max_length <= 1024, "max_length");
  FUZZ_CHECK(!m.tokenizer.pad_token.empty(), "pad_token");
  const bool has_tokenizer_2 =
      std::find(spec.sections.begin(), spec.sections.end(), "tokenizer_2") != spec.sections.end();
  FUZZ_CHECK(m.tokenizer_2.has_value() == has_tokenizer_2, "tokenizer_2 of kind " + m.kind);
  const RequestLimits& l = m.limits;
  FUZZ_CHECK(l.max_steps >= 1 && l.max_width >= 1 && l.max_height >= 1 && l.max_images >= 1 &&
                 l.max_prompts >= 1 && l.max_queue >= 1,
             "limits");
  FUZZ_CHECK(l.max_steps <= m.scheduler.num_train_timesteps, "max_steps");
  FUZZ_CHECK(l.max_steps <= 10000 && l.max_width <= 16384 && l.max_height <= 16384 &&
                 l.max_images <= 64 && l.max_prompts <= 1024 && l.max_queue <= 100000 &&
                 m.scheduler.num_train_timesteps <= 10000 && m.latent.channels <= 1024,
             "Note [Manifest number ranges]");
  const GenerationDefaults& d = m.defaults;
  FUZZ_CHECK(d.steps >= 1 && d.steps <= l.max_steps, "defaults.steps");
  FUZZ_CHECK(std::isfinite(d.guidance_scale) && d.guidance_scale >= 0, "defaults.guidance_scale");
  FUZZ_CHECK(IsPositiveMultiple(d.width, m.latent.downscale) && d.width <= l.max_width,
             "defaults.width");
  FUZZ_CHECK(IsPositiveMultiple(d.height, m.latent.downscale) && d.height <= l.max_height,
             "defaults.height");
  FUZZ_CHECK(m.latent.scaling_factor > 0 && std::isfinite(m.latent.scaling_factor),
             "latent.scaling_factor");
  FUZZ_CHECK(IsValidDevice(m.placement.device), "placement.device");
  FUZZ_CHECK(m.placement.replicas >= 0 && m.placement.max_replicas >= 0, "replicas");
  FUZZ_CHECK(m.batching.max_batch >= 1 && m.batching.max_batch <= 64, "batching.max_batch");
  FUZZ_CHECK(m.execution.max_graphs >= 1 && m.execution.max_graphs <= 16, "max_graphs");
}

// Resolves `in` as a pipeline of the manifest's kind would; only OK or INVALID_ARGUMENT may come
// back, and a resolved request is inside the manifest's limits.
void Resolve(const GenerateRequestIn& in, const PipelineManifest& m,
             const RequestFeatures& features) {
  const StatusOr<GenerateParams> p = ResolveGenerateRequest(in, m, features);
  if (!p.ok()) {
    FUZZ_CHECK(p.status().code() == StatusCode::kInvalidArgument, p.status().ToString());
    return;
  }
  FUZZ_CHECK(p->steps >= 1 && p->steps <= m.limits.max_steps, "steps");
  FUZZ_CHECK(p->width >= 1 && p->width <= m.limits.max_width, "width");
  FUZZ_CHECK(p->height >= 1 && p->height <= m.limits.max_height, "height");
  FUZZ_CHECK(p->num_images >= 1 && p->num_images <= m.limits.max_images, "num_images");
}

}  // namespace
}  // namespace qpool::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  static const fuzz::Repository repository;
  static const KindCatalog kinds = testing::BuiltinKindCatalog();

  const std::string text(reinterpret_cast<const char*>(data), size);
  const StatusOr<PipelineManifest> m = ParseManifest(text, repository.pipeline_dir(), kinds);
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == StatusCode::kInvalidArgument, m.status().ToString());
    FUZZ_CHECK(fuzz::StartsWith(m.status().message(), repository.pipeline_dir() + "/pipeline.yaml"),
               "error does not name the manifest: " + m.status().message());
    return 0;
  }
  fuzz::CheckManifest(*m, kinds);

  // The kind's request features (pipeline/<kind>/<kind>_kind.cpp). FluxKind also makes sizes
  // multiples of 2 x latent.downscale; that lives with LibTorch, so the default multiple is used.
  RequestFeatures features;
  features.schedule = kinds.at(m->kind).schedule;
  features.size_conditioning = m->kind == "sdxl";
  features.embedded_guidance = m->kind == "flux";
  fuzz::Resolve(GenerateRequestIn{}, *m, features);  // every field from the defaults
  GenerateRequestIn at_limits;
  at_limits.steps = static_cast<uint32_t>(m->limits.max_steps);
  at_limits.width = static_cast<uint32_t>(m->limits.max_width);
  at_limits.height = static_cast<uint32_t>(m->limits.max_height);
  at_limits.num_images = static_cast<uint32_t>(m->limits.max_images);
  at_limits.seed = 0;
  fuzz::Resolve(at_limits, *m, features);
  const Status encode = ValidateEncodePrompts({"a photo of a cat"}, *m);
  FUZZ_CHECK(encode.ok(), encode.ToString());
  return 0;
}
