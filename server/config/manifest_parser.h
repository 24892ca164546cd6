// The pipeline.yaml parser behind ParseManifest (manifest.h): generic readers of typed fields
// (manifest_parser.cpp) and one parser per manifest section (manifest_sections.cpp). Internal to
// server/config.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "config/manifest.h"
#include "util/log.h"
#include "util/status.h"

namespace qpool::manifest_internal {

// Note [Manifest errors name the file and the field]
// An operator fixing a broken pipeline.yaml should not have to guess: every error starts with the
// manifest's absolute path and names the offending field by its dotted path
// ("components.unet.quantization.blocksize"), says what was expected and what was found. Unknown
// keys are errors too (a typo such as `stpes:` must not silently fall back to the default), and a
// quoted scalar ("20") is a string, not a number, as in YAML itself. Parsing stops at the first
// error: fields are checked in the order of docs/model-repository.md, so one manifest always
// produces the same message.

// The keys each section accepts, in the order of docs/model-repository.md.
inline const std::vector<std::string> kTopKeys = {
    "kind",        "components",   "tokenizer", "tokenizer_2", "tokenizer_3",
    "tokenizer_4", "conditioning", "scheduler", "latent",      "defaults",
    "limits",      "placement",    "offload",   "batching",    "execution"};
// The top-level keys only some kinds read (KindManifestSpec::sections).
inline const std::vector<std::string> kKindSectionKeys = {"tokenizer_2", "tokenizer_3",
                                                          "tokenizer_4", "conditioning"};
inline const std::vector<std::string> kComponentKeys = {"file",  "sha256",       "weights",
                                                        "dtype", "quantization", "compiled"};
inline const std::vector<std::string> kWeightsKeys = {"file", "sha256"};
inline const std::vector<std::string> kCompiledKeys = {"file", "device", "sha256"};
inline const std::vector<std::string> kConditioningKeys = {"force_zeros_for_empty_prompt",
                                                           "padded_image_tokens"};
inline const std::vector<std::string> kQuantKeys = {"format", "blocksize", "double_quant", "skip",
                                                    "min_weights"};
inline const std::vector<std::string> kTokenizerKeys = {"vocab", "merges", "max_length",
                                                        "pad_token"};
inline const std::vector<std::string> kSentencePieceKeys = {"model", "max_length"};
inline const std::vector<std::string> kTokenizerJsonKeys = {"json", "max_length", "pad_token"};
inline const std::vector<std::string> kSchedulerKeys = {
    "num_train_timesteps", "beta_start",       "beta_end",        "beta_schedule",
    "timestep_spacing",    "steps_offset",     "prediction_type", "set_alpha_to_one",
    "clip_sample",         "clip_sample_range"};
inline const std::vector<std::string> kFlowSchedulerKeys = {
    "num_train_timesteps", "shift",     "use_dynamic_shifting",
    "base_shift",          "max_shift", "base_image_seq_len",
    "max_image_seq_len"};
inline const std::vector<std::string> kLatentKeys = {"channels", "downscale", "scaling_factor",
                                                     "shift_factor"};
inline const std::vector<std::string> kDefaultsKeys = {"steps", "guidance_scale", "width", "height",
                                                       "scheduler"};
inline const std::vector<std::string> kLimitsKeys = {"max_steps",  "max_width",   "max_height",
                                                     "max_images", "max_prompts", "max_queue"};
inline const std::vector<std::string> kPlacementKeys = {"device", "dtype", "replicas",
                                                        "max_replicas"};
inline const std::vector<std::string> kOffloadKeys = {"policy", "idle_seconds", "group_mib",
                                                      "prefetch", "resident_mib"};
inline const std::vector<std::string> kBatchingKeys = {"max_batch", "max_delay_ms"};
inline const std::vector<std::string> kExecutionKeys = {"cuda_graphs", "max_graphs", "warmup"};

// Helpers of the readers and the section parsers.
std::string Join(const std::vector<std::string>& items);
bool Contains(const std::vector<std::string>& items, const std::string& x);
std::string Dotted(const std::string& prefix, const std::string& key);
// "'twenty'", "a mapping", "a list", "an empty value": what the manifest holds instead.
std::string Describe(const YAML::Node& node);
// A YAML scalar that was written without quotes (quoted scalars are strings, never numbers).
bool IsPlainScalar(const YAML::Node& node);
bool IsPowerOfTwo(int x);

class Parser {
 public:
  Parser(std::string dir, std::string path, const KindCatalog& kinds)
      : dir_(std::move(dir)), path_(std::move(path)), kinds_(kinds) {}

  StatusOr<PipelineManifest> Parse(const std::string& text);

 private:
  Status Error(const std::string& field, const std::string& what) const {
    return InvalidArgument(StrCat(path_, ": field '", field, "' ", what));
  }
  template <typename T>
  Status Got(const std::string& field, const std::string& what, const T& value) const {
    return Error(field, StrCat(what, " (got ", value, ")"));
  }

  Status CheckKeys(const YAML::Node& map, const std::string& prefix,
                   const std::vector<std::string>& known, const std::string& unknown_what) const;
  // Looks up prefix.key as a mapping whose keys must be in `known` (unchecked if empty); absent or
  // empty gives an empty mapping unless `required`.
  Status GetSection(const YAML::Node& parent, const std::string& prefix, const std::string& key,
                    bool required, const std::vector<std::string>& known, YAML::Node* out) const;
  // Readers leave *out unchanged when the key is absent; `required` makes absence an error.
  Status ReadString(const YAML::Node& map, const std::string& prefix, const std::string& key,
                    bool required, std::string* out) const;
  // T is int or double; a quoted scalar, a fraction for an int, or inf/nan is a type error.
  template <typename T>
  Status ReadNumber(const YAML::Node& map, const std::string& prefix, const std::string& key,
                    T* out) const;
  Status ReadBool(const YAML::Node& map, const std::string& prefix, const std::string& key,
                  bool* out) const;
  Status ReadStringList(const YAML::Node& map, const std::string& prefix, const std::string& key,
                        std::vector<std::string>* out) const;
  Status CheckOneOf(const std::string& field, const std::string& value,
                    const std::vector<std::string>& allowed) const;
  Status ResolveFile(const YAML::Node& map, const std::string& prefix, const std::string& key,
                     std::string* out) const;

  // `prefix`.sha256 of `map` when present: 64 lowercase hex digits.
  Status ReadSha256(const YAML::Node& map, const std::string& prefix, std::string* out) const;
  Status ParseComponents(const YAML::Node& root, PipelineManifest* m) const;
  Status ParseQuantization(const YAML::Node& comp, const std::string& prefix,
                           QuantizationSpec* q) const;
  // components.<name>.weights, when present.
  Status ParseWeights(const YAML::Node& comp, const std::string& prefix,
                      std::optional<WeightsSpec>* w) const;
  // components.<name>.compiled, when present.
  Status ParseCompiled(const YAML::Node& comp, const std::string& prefix,
                       std::optional<CompiledSpec>* c) const;
  // The tokenizer section called `key` (tokenizer, tokenizer_2), of `format`.
  Status ParseTokenizer(const YAML::Node& root, const std::string& key, TokenizerFormat format,
                        TokenizerSpec* t) const;
  // tokenizer_2 and conditioning: refused for kinds that do not read them.
  Status ParseKindSections(const YAML::Node& root, PipelineManifest* m) const;
  Status ParseScheduler(const YAML::Node& root, ScheduleFamily family, SchedulerConfig* s) const;
  Status ParseFlowScheduler(const YAML::Node& node, SchedulerConfig* s) const;
  Status ParseLatent(const YAML::Node& root, LatentSpec* l) const;
  Status ParseLimits(const YAML::Node& root, const SchedulerConfig& s, RequestLimits* l) const;
  Status ParseDefaults(const YAML::Node& root, const LatentSpec& latent,
                       const RequestLimits& limits, ScheduleFamily family,
                       GenerationDefaults* d) const;
  Status ParsePlacement(const YAML::Node& root, Placement* p) const;
  Status ParseOffload(const YAML::Node& root, OffloadPolicy* o) const;
  Status ParseBatching(const YAML::Node& root, BatchingSpec* b) const;
  Status ParseExecution(const YAML::Node& root, ExecutionSpec* e) const;

  std::string dir_;
  std::string path_;
  const KindCatalog& kinds_;
};

}  // namespace qpool::manifest_internal
