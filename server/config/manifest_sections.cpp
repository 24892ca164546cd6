// One parser per section of pipeline.yaml (Note [Manifest errors name the file and the field]).
#include <cmath>
#include <filesystem>
#include <tuple>

#include "config/manifest_parser.h"
#include "util/file_digest.h"

namespace fs = std::filesystem;

namespace qpool::manifest_internal {

Status Parser::ParseQuantization(const YAML::Node& comp, const std::string& prefix,
                                 QuantizationSpec* q) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(comp, prefix, "quantization", false, kQuantKeys, &node));
  const std::string field = Dotted(prefix, "quantization");
  RETURN_IF_ERROR(ReadString(node, field, "format", false, &q->format));
  RETURN_IF_ERROR(CheckOneOf(field + ".format", q->format, {"none", "int8", "nf4", "w8a8"}));
  RETURN_IF_ERROR(ReadNumber(node, field, "blocksize", &q->blocksize));
  if (!IsPowerOfTwo(q->blocksize) || q->blocksize < 16 || q->blocksize > 4096) {
    return Got(field + ".blocksize", "must be a power of two between 16 and 4096", q->blocksize);
  }
  if (node["blocksize"].IsDefined() && q->format != "nf4") {
    return Error(field + ".blocksize",
                 "applies to format nf4 only (format is '" + q->format + "')");
  }
  RETURN_IF_ERROR(ReadBool(node, field, "double_quant", &q->double_quant));
  if (q->double_quant && q->format != "nf4") {
    return Error(field + ".double_quant",
                 "applies to format nf4 only (format is '" + q->format + "')");
  }
  RETURN_IF_ERROR(ReadNumber(node, field, "min_weights", &q->min_weights));
  if (q->min_weights < 0) return Got(field + ".min_weights", "must be >= 0", q->min_weights);
  return ReadStringList(node, field, "skip", &q->skip);
}

Status Parser::ReadSha256(const YAML::Node& map, const std::string& prefix,
                          std::string* out) const {
  RETURN_IF_ERROR(ReadString(map, prefix, "sha256", false, out));
  if (map["sha256"].IsDefined() && !IsSha256Hex(*out)) {
    return Error(Dotted(prefix, "sha256"), "must be 64 lowercase hex digits (the file's SHA-256)");
  }
  return Status::Ok();
}

Status Parser::ParseWeights(const YAML::Node& comp, const std::string& prefix,
                            std::optional<WeightsSpec>* w) const {
  if (!comp["weights"].IsDefined()) return Status::Ok();
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(comp, prefix, "weights", true, kWeightsKeys, &node));
  const std::string field = Dotted(prefix, "weights");
  WeightsSpec spec;
  RETURN_IF_ERROR(ResolveFile(node, field, "file", &spec.file));
  RETURN_IF_ERROR(ReadSha256(node, field, &spec.sha256));
  *w = std::move(spec);
  return Status::Ok();
}

Status Parser::ParseCompiled(const YAML::Node& comp, const std::string& prefix,
                             std::optional<CompiledSpec>* c) const {
  if (!comp["compiled"].IsDefined()) return Status::Ok();
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(comp, prefix, "compiled", true, kCompiledKeys, &node));
  const std::string field = Dotted(prefix, "compiled");
  CompiledSpec spec;
  RETURN_IF_ERROR(ResolveFile(node, field, "file", &spec.file));
  RETURN_IF_ERROR(ReadString(node, field, "device", true, &spec.device));
  RETURN_IF_ERROR(CheckOneOf(field + ".device", spec.device, {"cpu", "cuda"}));
  RETURN_IF_ERROR(ReadSha256(node, field, &spec.sha256));
  *c = std::move(spec);
  return Status::Ok();
}

Status Parser::ParseComponents(const YAML::Node& root, PipelineManifest* m) const {
  const std::vector<std::string>& names = kinds_.at(m->kind).components;
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "components", /*required=*/true, {}, &node));
  RETURN_IF_ERROR(
      CheckKeys(node, "components", names, "is not a component of kind '" + m->kind + "'"));
  for (const auto& name : names) {
    const std::string field = "components." + name;
    YAML::Node comp;
    RETURN_IF_ERROR(GetSection(node, "components", name, /*required=*/true, kComponentKeys, &comp));
    ComponentSpec spec;
    spec.name = name;
    RETURN_IF_ERROR(ResolveFile(comp, field, "file", &spec.file));
    RETURN_IF_ERROR(ReadSha256(comp, field, &spec.sha256));
    RETURN_IF_ERROR(ParseWeights(comp, field, &spec.weights));
    RETURN_IF_ERROR(ReadString(comp, field, "dtype", false, &spec.dtype));
    if (comp["dtype"].IsDefined()) {
      RETURN_IF_ERROR(CheckOneOf(field + ".dtype", spec.dtype, {"float32", "float16", "bfloat16"}));
    }
    RETURN_IF_ERROR(ParseQuantization(comp, field, &spec.quantization));
    RETURN_IF_ERROR(ParseCompiled(comp, field, &spec.compiled));
    m->components.push_back(std::move(spec));
  }
  return Status::Ok();
}

Status Parser::ParseTokenizer(const YAML::Node& root, const std::string& key,
                              TokenizerFormat format, TokenizerSpec* t) const {
  YAML::Node node;
  const bool bpe = format == TokenizerFormat::kClipBpe;
  const bool json = format == TokenizerFormat::kTokenizerJson;
  RETURN_IF_ERROR(GetSection(root, "", key, /*required=*/true,
                             bpe    ? kTokenizerKeys
                             : json ? kTokenizerJsonKeys
                                    : kSentencePieceKeys,
                             &node));
  if (bpe) {
    RETURN_IF_ERROR(ResolveFile(node, key, "vocab", &t->vocab));
    RETURN_IF_ERROR(ResolveFile(node, key, "merges", &t->merges));
  } else if (json) {
    RETURN_IF_ERROR(ResolveFile(node, key, "json", &t->json));
  } else {
    RETURN_IF_ERROR(ResolveFile(node, key, "model", &t->model));
  }
  RETURN_IF_ERROR(ReadNumber(node, key, "max_length", &t->max_length));
  if (t->max_length < 2 || t->max_length > 1024) {
    return Got(Dotted(key, "max_length"), "must be between 2 and 1024", t->max_length);
  }
  if (!bpe && !json) return Status::Ok();
  RETURN_IF_ERROR(ReadString(node, key, "pad_token", /*required=*/json, &t->pad_token));
  if (t->pad_token.empty()) return Error(Dotted(key, "pad_token"), "must not be empty");
  return Status::Ok();
}

// The most tokens a padded image may have: 4096 for HiDream-I1's 1024x1024 (Note [Manifest
// number ranges]).
constexpr int kMaxPaddedImageTokens = 1 << 16;

Status Parser::ParseKindSections(const YAML::Node& root, PipelineManifest* m) const {
  const KindManifestSpec& spec = kinds_.at(m->kind);
  const std::vector<std::string>& own = spec.sections;
  for (const auto& key : kKindSectionKeys) {
    if (root[key].IsDefined() && !Contains(own, key)) {
      return Error(key, "is not read by pipelines of kind '" + m->kind + "'");
    }
  }
  for (auto [key, section] :
       {std::pair{"tokenizer_2", &m->tokenizer_2}, std::pair{"tokenizer_3", &m->tokenizer_3},
        std::pair{"tokenizer_4", &m->tokenizer_4}}) {
    if (!Contains(own, key)) continue;
    section->emplace();
    RETURN_IF_ERROR(ParseTokenizer(root, key, spec.TokenizerFormatOf(key), &**section));
  }
  if (Contains(own, "conditioning")) {
    YAML::Node node;
    RETURN_IF_ERROR(GetSection(root, "", "conditioning", false, kConditioningKeys, &node));
    RETURN_IF_ERROR(ReadBool(node, "conditioning", "force_zeros_for_empty_prompt",
                             &m->conditioning.force_zeros_for_empty_prompt));
    int& padded = m->conditioning.padded_image_tokens;
    RETURN_IF_ERROR(ReadNumber(node, "conditioning", "padded_image_tokens", &padded));
    if (padded != 0 && m->kind != "hidream") {
      return Error("conditioning.padded_image_tokens",
                   "is read by pipelines of kind 'hidream' only, not '" + m->kind + "'");
    }
    if (padded < 0 || padded > kMaxPaddedImageTokens) {
      return Got("conditioning.padded_image_tokens",
                 StrCat("must be between 1 and ", kMaxPaddedImageTokens), padded);
    }
  }
  return Status::Ok();
}

// Note [Manifest number ranges]
// Every number a manifest holds has a range checked here, the importer writes only values inside
// it, and docs/model-repository.md lists them: a manifest is input (the importer copies a
// downloaded scheduler_config.json into it), and an unbounded number reaches allocations (a
// schedule's tables, a request's latents) before anything else looks at it.
constexpr int kMaxTrainTimesteps = 10000;
constexpr int kMaxImageSeqLen = 1 << 20;
constexpr double kMaxClipSampleRange = 1000;

Status Parser::ParseScheduler(const YAML::Node& root, ScheduleFamily family,
                              SchedulerConfig* s) const {
  YAML::Node node;
  const bool flow = family == ScheduleFamily::kFlowMatch;
  RETURN_IF_ERROR(
      GetSection(root, "", "scheduler", false, flow ? kFlowSchedulerKeys : kSchedulerKeys, &node));
  const std::string p = "scheduler";
  RETURN_IF_ERROR(ReadNumber(node, p, "num_train_timesteps", &s->num_train_timesteps));
  // Note [Manifest number ranges]: a schedule's tables are this long (diffusers' models train
  // on 1000); 1e9 passed the parse and cost the first request gigabytes of tables.
  if (s->num_train_timesteps < 1 || s->num_train_timesteps > kMaxTrainTimesteps) {
    return Got("scheduler.num_train_timesteps",
               StrCat("must be between 1 and ", kMaxTrainTimesteps), s->num_train_timesteps);
  }
  if (flow) return ParseFlowScheduler(node, s);
  RETURN_IF_ERROR(ReadNumber(node, p, "beta_start", &s->beta_start));
  RETURN_IF_ERROR(ReadNumber(node, p, "beta_end", &s->beta_end));
  if (s->beta_start <= 0 || s->beta_start >= 1) {
    return Got("scheduler.beta_start", "must be > 0 and < 1", s->beta_start);
  }
  if (s->beta_end <= s->beta_start || s->beta_end >= 1) {
    return Got("scheduler.beta_end",
               StrCat("must be > scheduler.beta_start (", s->beta_start, ") and < 1"), s->beta_end);
  }
  RETURN_IF_ERROR(ReadString(node, p, "beta_schedule", false, &s->beta_schedule));
  RETURN_IF_ERROR(
      CheckOneOf("scheduler.beta_schedule", s->beta_schedule, {"scaled_linear", "linear"}));
  RETURN_IF_ERROR(ReadString(node, p, "timestep_spacing", false, &s->timestep_spacing));
  RETURN_IF_ERROR(CheckOneOf("scheduler.timestep_spacing", s->timestep_spacing,
                             {"leading", "linspace", "trailing"}));
  RETURN_IF_ERROR(ReadNumber(node, p, "steps_offset", &s->steps_offset));
  if (s->steps_offset < 0) return Got("scheduler.steps_offset", "must be >= 0", s->steps_offset);
  if (s->steps_offset >= s->num_train_timesteps) {
    return Got("scheduler.steps_offset",
               StrCat("must be < scheduler.num_train_timesteps (", s->num_train_timesteps, ")"),
               s->steps_offset);
  }
  RETURN_IF_ERROR(ReadString(node, p, "prediction_type", false, &s->prediction_type));
  RETURN_IF_ERROR(
      CheckOneOf("scheduler.prediction_type", s->prediction_type, {"epsilon", "v_prediction"}));
  RETURN_IF_ERROR(ReadBool(node, p, "set_alpha_to_one", &s->set_alpha_to_one));
  RETURN_IF_ERROR(ReadBool(node, p, "clip_sample", &s->clip_sample));
  RETURN_IF_ERROR(ReadNumber(node, p, "clip_sample_range", &s->clip_sample_range));
  if (!(s->clip_sample_range > 0) || s->clip_sample_range > kMaxClipSampleRange) {
    return Got("scheduler.clip_sample_range", StrCat("must be in (0, ", kMaxClipSampleRange, "]"),
               s->clip_sample_range);
  }
  return Status::Ok();
}

Status Parser::ParseFlowScheduler(const YAML::Node& node, SchedulerConfig* s) const {
  FlowShiftConfig& f = s->flow;
  const std::string p = "scheduler";
  RETURN_IF_ERROR(ReadNumber(node, p, "shift", &f.shift));
  if (!(f.shift > 0) || f.shift > 1000)
    return Got("scheduler.shift", "must be in (0, 1000]", f.shift);
  RETURN_IF_ERROR(ReadBool(node, p, "use_dynamic_shifting", &f.use_dynamic_shifting));
  RETURN_IF_ERROR(ReadNumber(node, p, "base_shift", &f.base_shift));
  RETURN_IF_ERROR(ReadNumber(node, p, "max_shift", &f.max_shift));
  for (const auto& [key, value] :
       {std::pair<const char*, double>{"base_shift", f.base_shift}, {"max_shift", f.max_shift}}) {
    if (!std::isfinite(value) || value < -20 || value > 20) {
      return Got(Dotted(p, key), "must be in [-20, 20]", value);
    }
  }
  RETURN_IF_ERROR(ReadNumber(node, p, "base_image_seq_len", &f.base_image_seq_len));
  RETURN_IF_ERROR(ReadNumber(node, p, "max_image_seq_len", &f.max_image_seq_len));
  if (f.base_image_seq_len < 1 || f.base_image_seq_len > kMaxImageSeqLen) {
    return Got("scheduler.base_image_seq_len", StrCat("must be between 1 and ", kMaxImageSeqLen),
               f.base_image_seq_len);
  }
  if (f.max_image_seq_len > kMaxImageSeqLen) {
    return Got("scheduler.max_image_seq_len", StrCat("must be at most ", kMaxImageSeqLen),
               f.max_image_seq_len);
  }
  if (f.max_image_seq_len <= f.base_image_seq_len) {
    return Got("scheduler.max_image_seq_len",
               StrCat("must be > scheduler.base_image_seq_len (", f.base_image_seq_len, ")"),
               f.max_image_seq_len);
  }
  return Status::Ok();
}

Status Parser::ParseLatent(const YAML::Node& root, LatentSpec* l) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "latent", false, kLatentKeys, &node));
  RETURN_IF_ERROR(ReadNumber(node, "latent", "channels", &l->channels));
  if (l->channels < 1 || l->channels > 1024) {
    return Got("latent.channels", "must be between 1 and 1024", l->channels);
  }
  RETURN_IF_ERROR(ReadNumber(node, "latent", "downscale", &l->downscale));
  // Real autoencoders downscale by 8 or 16; the bound keeps size arithmetic far from overflow.
  if (l->downscale < 1 || l->downscale > 64) {
    return Got("latent.downscale", "must be between 1 and 64", l->downscale);
  }
  RETURN_IF_ERROR(ReadNumber(node, "latent", "scaling_factor", &l->scaling_factor));
  if (!(l->scaling_factor > 0) || l->scaling_factor > 1000) {
    return Got("latent.scaling_factor", "must be in (0, 1000]", l->scaling_factor);
  }
  RETURN_IF_ERROR(ReadNumber(node, "latent", "shift_factor", &l->shift_factor));
  if (!std::isfinite(l->shift_factor) || std::abs(l->shift_factor) > 100) {
    return Got("latent.shift_factor", "must be in [-100, 100]", l->shift_factor);
  }
  return Status::Ok();
}

Status Parser::ParseLimits(const YAML::Node& root, const SchedulerConfig& s,
                           RequestLimits* l) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "limits", false, kLimitsKeys, &node));
  // Note [Manifest number ranges]: each limit has a ceiling far above what a model serves, so
  // that the size arithmetic of a request at the limits stays far from overflow.
  const std::tuple<const char*, int*, int> fields[] = {
      {"max_steps", &l->max_steps, 10000},    {"max_width", &l->max_width, 16384},
      {"max_height", &l->max_height, 16384},  {"max_images", &l->max_images, 64},
      {"max_prompts", &l->max_prompts, 1024}, {"max_queue", &l->max_queue, 100000}};
  for (const auto& [key, value, most] : fields) {
    RETURN_IF_ERROR(ReadNumber(node, "limits", key, value));
    if (*value < 1 || *value > most) {
      return Got(Dotted("limits", key), StrCat("must be between 1 and ", most), *value);
    }
  }
  // Note: more steps than training timesteps would repeat timesteps (step ratio 0).
  if (l->max_steps > s.num_train_timesteps) {
    return Got("limits.max_steps",
               StrCat("must be <= scheduler.num_train_timesteps (", s.num_train_timesteps, ")"),
               l->max_steps);
  }
  return Status::Ok();
}

Status Parser::ParseDefaults(const YAML::Node& root, const LatentSpec& latent,
                             const RequestLimits& limits, ScheduleFamily family,
                             GenerationDefaults* d) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "defaults", false, kDefaultsKeys, &node));
  RETURN_IF_ERROR(ReadNumber(node, "defaults", "steps", &d->steps));
  if (d->steps < 1 || d->steps > limits.max_steps) {
    return Got("defaults.steps",
               StrCat("must be between 1 and limits.max_steps (", limits.max_steps, ")"), d->steps);
  }
  RETURN_IF_ERROR(ReadNumber(node, "defaults", "guidance_scale", &d->guidance_scale));
  if (d->guidance_scale < 0)
    return Got("defaults.guidance_scale", "must be >= 0", d->guidance_scale);
  const std::tuple<const char*, int*, int, const char*> sizes[] = {
      {"width", &d->width, limits.max_width, "limits.max_width"},
      {"height", &d->height, limits.max_height, "limits.max_height"}};
  for (const auto& [key, value, max, max_name] : sizes) {
    const std::string field = Dotted("defaults", key);
    RETURN_IF_ERROR(ReadNumber(node, "defaults", key, value));
    if (*value < latent.downscale || *value > max) {
      return Got(field,
                 StrCat("must be between latent.downscale (", latent.downscale, ") and ", max_name,
                        " (", max, ")"),
                 *value);
    }
    if (*value % latent.downscale != 0) {
      return Got(field, StrCat("must be a multiple of ", latent.downscale, " (latent.downscale)"),
                 *value);
    }
  }
  // The family's first sampler unless the manifest names one.
  d->scheduler = SamplerNames(family).front();
  RETURN_IF_ERROR(ReadString(node, "defaults", "scheduler", false, &d->scheduler));
  return CheckOneOf("defaults.scheduler", d->scheduler, SamplerNames(family));
}

Status Parser::ParsePlacement(const YAML::Node& root, Placement* p) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "placement", false, kPlacementKeys, &node));
  RETURN_IF_ERROR(ReadString(node, "placement", "device", false, &p->device));
  if (!IsValidDevice(p->device)) {
    return Got("placement.device", "must be auto, cpu, cuda, cuda:N or a list cuda:N,cuda:M",
               "'" + p->device + "'");
  }
  for (const char* key : {"replicas", "max_replicas"}) {
    int* count = std::string(key) == "replicas" ? &p->replicas : &p->max_replicas;
    const YAML::Node value = node[key];
    if (value.IsDefined() && value.IsScalar() && value.Scalar() == "all") {
      *count = 0;
    } else if (value.IsDefined()) {
      RETURN_IF_ERROR(ReadNumber(node, "placement", key, count));
      if (*count < 1) return Got(Dotted("placement", key), "must be >= 1 or all", *count);
    }
  }
  if (p->max_replicas < 0) p->max_replicas = p->replicas;  // no scale-out
  if (p->max_replicas != 0 && (p->replicas == 0 || p->max_replicas < p->replicas)) {
    return Got("placement.max_replicas", "must be >= placement.replicas", p->max_replicas);
  }
  RETURN_IF_ERROR(ReadString(node, "placement", "dtype", false, &p->dtype));
  return CheckOneOf("placement.dtype", p->dtype, {"auto", "float32", "float16", "bfloat16"});
}

Status Parser::ParseOffload(const YAML::Node& root, OffloadPolicy* o) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "offload", false, kOffloadKeys, &node));
  std::string policy = OffloadModeName(o->mode);
  RETURN_IF_ERROR(ReadString(node, "offload", "policy", false, &policy));
  if (policy == "group") {
    return Got(
        "offload.policy",
        "is not a policy: use sequential, whose group_mib sets how much is streamed together",
        "'" + policy + "'");
  }
  RETURN_IF_ERROR(CheckOneOf("offload.policy", policy, {"none", "model", "idle", "sequential"}));
  RETURN_IF_ERROR(ReadNumber(node, "offload", "idle_seconds", &o->idle_seconds));
  if (!(o->idle_seconds > 0) || o->idle_seconds > kMaxIdleSeconds) {
    return Got("offload.idle_seconds", "must be in (0, 604800]", o->idle_seconds);
  }
  StreamSettings& s = o->stream;
  RETURN_IF_ERROR(ReadNumber(node, "offload", "group_mib", &s.group_mib));
  if (!(s.group_mib >= 0) || s.group_mib > kMaxGroupMib) {
    return Got("offload.group_mib", "must be in [0, 65536]", s.group_mib);
  }
  RETURN_IF_ERROR(ReadNumber(node, "offload", "prefetch", &s.prefetch));
  if (s.prefetch < 0 || s.prefetch > kMaxPrefetch) {
    return Got("offload.prefetch", "must be in [0, 16]", s.prefetch);
  }
  RETURN_IF_ERROR(ReadNumber(node, "offload", "resident_mib", &s.resident_mib));
  if (!(s.resident_mib >= 0) || s.resident_mib > kMaxResidentMib) {
    return Got("offload.resident_mib", "must be in [0, 1048576]", s.resident_mib);
  }
  // The checks above are MakeOffloadPolicy's, with the manifest's field names.
  ASSIGN_OR_RETURN(*o, MakeOffloadPolicy(policy, o->idle_seconds, s));
  return Status::Ok();
}

Status Parser::ParseBatching(const YAML::Node& root, BatchingSpec* b) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "batching", false, kBatchingKeys, &node));
  RETURN_IF_ERROR(ReadNumber(node, "batching", "max_batch", &b->max_batch));
  if (b->max_batch < 1 || b->max_batch > 64) {
    return Got("batching.max_batch", "must be between 1 (off) and 64 images", b->max_batch);
  }
  RETURN_IF_ERROR(ReadNumber(node, "batching", "max_delay_ms", &b->max_delay_ms));
  if (!(b->max_delay_ms >= 0) || b->max_delay_ms > 10000) {
    return Got("batching.max_delay_ms", "must be in [0, 10000]", b->max_delay_ms);
  }
  return Status::Ok();
}

Status Parser::ParseExecution(const YAML::Node& root, ExecutionSpec* e) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "execution", false, kExecutionKeys, &node));
  RETURN_IF_ERROR(ReadBool(node, "execution", "cuda_graphs", &e->cuda_graphs));
  RETURN_IF_ERROR(ReadNumber(node, "execution", "max_graphs", &e->max_graphs));
  RETURN_IF_ERROR(ReadBool(node, "execution", "warmup", &e->warmup));
  if (e->max_graphs < 1 || e->max_graphs > 16) {
    return Got("execution.max_graphs", "must be between 1 and 16", e->max_graphs);
  }
  return Status::Ok();
}

StatusOr<PipelineManifest> Parser::Parse(const std::string& text) {
  // One document: ParseManifest's event pass refused texts with more (Note [Manifests without
  // aliases] in manifest.cpp).
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return InvalidArgument(StrCat(path_, ": invalid YAML: ", e.msg));
    return InvalidArgument(StrCat(path_, ": invalid YAML at line ", e.mark.line + 1, ", column ",
                                  e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsMap()) {
    return InvalidArgument(StrCat(path_, ": the top level must be a mapping with fields kind, ",
                                  "components, tokenizer, ... (got ", Describe(root), ")"));
  }
  RETURN_IF_ERROR(CheckKeys(root, "", kTopKeys, "is not a known field"));

  PipelineManifest m;
  m.dir = dir_;
  m.path = path_;
  m.name = fs::path(dir_).filename().string();
  RETURN_IF_ERROR(ReadString(root, "", "kind", /*required=*/true, &m.kind));
  if (kinds_.count(m.kind) == 0) {
    std::vector<std::string> known;
    for (const auto& [kind, components] : kinds_) known.push_back(kind);
    return Got("kind", "names an unknown pipeline kind (supported: " + Join(known) + ")",
               "'" + m.kind + "'");
  }
  RETURN_IF_ERROR(ParseComponents(root, &m));
  const KindManifestSpec& spec = kinds_.at(m.kind);
  RETURN_IF_ERROR(ParseTokenizer(root, "tokenizer", TokenizerFormat::kClipBpe, &m.tokenizer));
  RETURN_IF_ERROR(ParseKindSections(root, &m));
  RETURN_IF_ERROR(ParseScheduler(root, spec.schedule, &m.scheduler));
  RETURN_IF_ERROR(ParseLatent(root, &m.latent));
  RETURN_IF_ERROR(ParseLimits(root, m.scheduler, &m.limits));
  RETURN_IF_ERROR(ParseDefaults(root, m.latent, m.limits, spec.schedule, &m.defaults));
  RETURN_IF_ERROR(ParsePlacement(root, &m.placement));
  RETURN_IF_ERROR(ParseOffload(root, &m.offload));
  RETURN_IF_ERROR(ParseBatching(root, &m.batching));
  RETURN_IF_ERROR(ParseExecution(root, &m.execution));
  return m;
}

}  // namespace qpool::manifest_internal
