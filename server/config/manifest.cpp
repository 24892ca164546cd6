#include "config/manifest.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <type_traits>

#include "util/log.h"

namespace fs = std::filesystem;

namespace qpool {

// Note [Manifest errors name the file and the field]
// An operator fixing a broken pipeline.yaml should not have to guess: every error starts with the
// manifest's absolute path and names the offending field by its dotted path
// ("components.unet.quantization.blocksize"), says what was expected and what was found. Unknown
// keys are errors too (a typo such as `stpes:` must not silently fall back to the default), and a
// quoted scalar ("20") is a string, not a number, as in YAML itself. Parsing stops at the first
// error: fields are checked in the order of docs/model-repository.md, so one manifest always
// produces the same message.

namespace {

const std::vector<std::string> kTopKeys = {"kind",   "components", "tokenizer", "scheduler",
                                           "latent", "defaults",   "limits",    "placement",
                                           "offload",  "batching"};
const std::vector<std::string> kComponentKeys = {"file", "quantization"};
const std::vector<std::string> kQuantKeys = {"format", "blocksize", "double_quant", "skip"};
const std::vector<std::string> kTokenizerKeys = {"vocab", "merges", "max_length"};
const std::vector<std::string> kSchedulerKeys = {
    "num_train_timesteps", "beta_start",   "beta_end",       "beta_schedule",
    "timestep_spacing",    "steps_offset", "prediction_type"};
const std::vector<std::string> kLatentKeys = {"channels", "downscale", "scaling_factor"};
const std::vector<std::string> kDefaultsKeys = {"steps", "guidance_scale", "width", "height",
                                                "scheduler"};
const std::vector<std::string> kLimitsKeys = {"max_steps",  "max_width",   "max_height",
                                              "max_images", "max_prompts", "max_queue"};
const std::vector<std::string> kPlacementKeys = {"device", "dtype", "replicas", "max_replicas"};
const std::vector<std::string> kOffloadKeys = {"policy", "idle_seconds", "group_mib", "prefetch",
                                               "resident_mib"};
const std::vector<std::string> kBatchingKeys = {"max_batch", "max_delay_ms"};

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

bool Contains(const std::vector<std::string>& items, const std::string& x) {
  for (const auto& item : items) {
    if (item == x) return true;
  }
  return false;
}

std::string Dotted(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// "'twenty'", "a mapping", "a list", "an empty value": what the manifest holds instead.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? "the quoted string '" + node.Scalar() + "'"
                               : "'" + node.Scalar() + "'";
    default:
      return "an empty value";
  }
}

// A YAML scalar that was written without quotes (quoted scalars are strings, never numbers).
bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

bool IsPowerOfTwo(int x) { return x > 0 && (x & (x - 1)) == 0; }

bool IsValidSingleDevice(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5 || d.size() > 8) return false;
  for (size_t i = 5; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9') return false;
  }
  return true;
}

}  // namespace

bool IsValidDevice(const std::string& d) {
  if (d.find(',') == std::string::npos) return IsValidSingleDevice(d);
  size_t start = 0;
  for (;;) {
    const size_t comma = d.find(',', start);
    const std::string one = d.substr(start, comma - start);
    if (one.rfind("cuda:", 0) != 0 || !IsValidSingleDevice(one)) return false;
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

namespace {

class Parser {
 public:
  Parser(std::string dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)) {}

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

  Status ParseComponents(const YAML::Node& root, PipelineManifest* m) const;
  Status ParseQuantization(const YAML::Node& comp, const std::string& prefix,
                           QuantizationSpec* q) const;
  Status ParseTokenizer(const YAML::Node& root, TokenizerSpec* t) const;
  Status ParseScheduler(const YAML::Node& root, SchedulerConfig* s) const;
  Status ParseLatent(const YAML::Node& root, LatentSpec* l) const;
  Status ParseLimits(const YAML::Node& root, const SchedulerConfig& s, RequestLimits* l) const;
  Status ParseDefaults(const YAML::Node& root, const LatentSpec& latent,
                       const RequestLimits& limits, GenerationDefaults* d) const;
  Status ParsePlacement(const YAML::Node& root, Placement* p) const;
  Status ParseOffload(const YAML::Node& root, OffloadSpec* o) const;
  Status ParseBatching(const YAML::Node& root, BatchingSpec* b) const;

  std::string dir_;
  std::string path_;
};

Status Parser::CheckKeys(const YAML::Node& map, const std::string& prefix,
                         const std::vector<std::string>& known,
                         const std::string& unknown_what) const {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) {
      return InvalidArgument(StrCat(path_, ": ",
                                    prefix.empty() ? "the top level" : "field '" + prefix + "'",
                                    " has a key that is not a name (", Describe(kv.first), ")"));
    }
    const std::string key = kv.first.Scalar();
    if (!Contains(known, key)) {
      return Error(Dotted(prefix, key),
                   StrCat(unknown_what, " (expected one of: ", Join(known), ")"));
    }
    if (!seen.insert(key).second) return Error(Dotted(prefix, key), "appears more than once");
  }
  return Status::Ok();
}

Status Parser::GetSection(const YAML::Node& parent, const std::string& prefix,
                          const std::string& key, bool required,
                          const std::vector<std::string>& known, YAML::Node* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = parent[key];
  if (!node.IsDefined()) {
    if (required) return Error(field, "is required");
    *out = YAML::Node(YAML::NodeType::Map);
    return Status::Ok();
  }
  if (node.IsNull()) {  // `tokenizer:` with nothing under it: an empty section.
    *out = YAML::Node(YAML::NodeType::Map);
    return Status::Ok();
  }
  if (!node.IsMap()) return Got(field, "must be a mapping", Describe(node));
  if (!known.empty()) RETURN_IF_ERROR(CheckKeys(node, field, known, "is not a known field"));
  *out = node;
  return Status::Ok();
}

Status Parser::ReadString(const YAML::Node& map, const std::string& prefix, const std::string& key,
                          bool required, std::string* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined() || (required && node.IsNull())) {
    return required ? Error(field, "is required") : Status::Ok();
  }
  if (!node.IsScalar()) return Got(field, "must be a string", Describe(node));
  *out = node.Scalar();
  return Status::Ok();
}

template <typename T>
Status Parser::ReadNumber(const YAML::Node& map, const std::string& prefix, const std::string& key,
                          T* out) const {
  constexpr bool kInt = std::is_integral_v<T>;
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined()) return Status::Ok();
  const char* expected = kInt ? "must be an integer" : "must be a number";
  if (!IsPlainScalar(node)) return Got(field, expected, Describe(node));
  const std::string& s = node.Scalar();
  std::conditional_t<kInt, long long, double> v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc() && kInt &&
       (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()))) {
    return Got(field, "is out of range", Describe(node));
  }
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(static_cast<double>(v))) {
    return Got(field, expected, Describe(node));
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status Parser::ReadBool(const YAML::Node& map, const std::string& prefix, const std::string& key,
                        bool* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined()) return Status::Ok();
  bool v = false;
  if (!IsPlainScalar(node) || !YAML::convert<bool>::decode(node, v)) {
    return Got(field, "must be a boolean (true or false)", Describe(node));
  }
  *out = v;
  return Status::Ok();
}

Status Parser::ReadStringList(const YAML::Node& map, const std::string& prefix,
                              const std::string& key, std::vector<std::string>* out) const {
  const std::string field = Dotted(prefix, key);
  const YAML::Node node = map[key];
  if (!node.IsDefined() || node.IsNull()) return Status::Ok();
  if (!node.IsSequence()) return Got(field, "must be a list of strings", Describe(node));
  std::vector<std::string> items;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    const std::string item_field = StrCat(field, "[", i, "]");
    if (!item.IsScalar()) return Got(item_field, "must be a string", Describe(item));
    if (item.Scalar().empty()) return Error(item_field, "must not be empty");
    items.push_back(item.Scalar());
  }
  *out = std::move(items);
  return Status::Ok();
}

Status Parser::CheckOneOf(const std::string& field, const std::string& value,
                          const std::vector<std::string>& allowed) const {
  if (Contains(allowed, value)) return Status::Ok();
  return Got(field, "must be one of: " + Join(allowed), "'" + value + "'");
}

Status Parser::ResolveFile(const YAML::Node& map, const std::string& prefix, const std::string& key,
                           std::string* out) const {
  const std::string field = Dotted(prefix, key);
  std::string rel;
  RETURN_IF_ERROR(ReadString(map, prefix, key, /*required=*/true, &rel));
  if (rel.empty()) return Error(field, "must not be empty");
  const fs::path p(rel);
  if (p.is_absolute() || p.has_root_path()) {
    return Got(field, "must be a path relative to the pipeline folder", "'" + rel + "'");
  }
  for (const auto& part : p) {
    if (part == "..") return Got(field, "must not contain a '..' segment", "'" + rel + "'");
  }
  const fs::path resolved = (fs::path(dir_) / p).lexically_normal();
  std::error_code ec;
  const fs::file_status st = fs::status(resolved, ec);
  if (!fs::exists(st))
    return Error(field, "names a file that does not exist: " + resolved.string());
  if (!fs::is_regular_file(st)) {
    return Error(field, "names something that is not a regular file: " + resolved.string());
  }
  *out = resolved.string();
  return Status::Ok();
}

Status Parser::ParseQuantization(const YAML::Node& comp, const std::string& prefix,
                                 QuantizationSpec* q) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(comp, prefix, "quantization", false, kQuantKeys, &node));
  const std::string field = Dotted(prefix, "quantization");
  RETURN_IF_ERROR(ReadString(node, field, "format", false, &q->format));
  RETURN_IF_ERROR(CheckOneOf(field + ".format", q->format, {"none", "int8", "nf4"}));
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
  return ReadStringList(node, field, "skip", &q->skip);
}

Status Parser::ParseComponents(const YAML::Node& root, PipelineManifest* m) const {
  const std::vector<std::string> names = RequiredComponents(m->kind);
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
    RETURN_IF_ERROR(ParseQuantization(comp, field, &spec.quantization));
    m->components.push_back(std::move(spec));
  }
  return Status::Ok();
}

Status Parser::ParseTokenizer(const YAML::Node& root, TokenizerSpec* t) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "tokenizer", /*required=*/true, kTokenizerKeys, &node));
  RETURN_IF_ERROR(ResolveFile(node, "tokenizer", "vocab", &t->vocab));
  RETURN_IF_ERROR(ResolveFile(node, "tokenizer", "merges", &t->merges));
  RETURN_IF_ERROR(ReadNumber(node, "tokenizer", "max_length", &t->max_length));
  if (t->max_length < 2 || t->max_length > 1024) {
    return Got("tokenizer.max_length", "must be between 2 and 1024", t->max_length);
  }
  return Status::Ok();
}

Status Parser::ParseScheduler(const YAML::Node& root, SchedulerConfig* s) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "scheduler", false, kSchedulerKeys, &node));
  const std::string p = "scheduler";
  RETURN_IF_ERROR(ReadNumber(node, p, "num_train_timesteps", &s->num_train_timesteps));
  if (s->num_train_timesteps < 1) {
    return Got("scheduler.num_train_timesteps", "must be >= 1", s->num_train_timesteps);
  }
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
  return CheckOneOf("scheduler.prediction_type", s->prediction_type, {"epsilon"});
}

Status Parser::ParseLatent(const YAML::Node& root, LatentSpec* l) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "latent", false, kLatentKeys, &node));
  RETURN_IF_ERROR(ReadNumber(node, "latent", "channels", &l->channels));
  if (l->channels < 1) return Got("latent.channels", "must be >= 1", l->channels);
  RETURN_IF_ERROR(ReadNumber(node, "latent", "downscale", &l->downscale));
  if (l->downscale < 1) return Got("latent.downscale", "must be >= 1", l->downscale);
  RETURN_IF_ERROR(ReadNumber(node, "latent", "scaling_factor", &l->scaling_factor));
  if (l->scaling_factor <= 0) return Got("latent.scaling_factor", "must be > 0", l->scaling_factor);
  return Status::Ok();
}

Status Parser::ParseLimits(const YAML::Node& root, const SchedulerConfig& s,
                           RequestLimits* l) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "limits", false, kLimitsKeys, &node));
  const std::pair<const char*, int*> fields[] = {{"max_steps", &l->max_steps},
                                                 {"max_width", &l->max_width},
                                                 {"max_height", &l->max_height},
                                                 {"max_images", &l->max_images},
                                                 {"max_prompts", &l->max_prompts},
                                                 {"max_queue", &l->max_queue}};
  for (const auto& [key, value] : fields) {
    RETURN_IF_ERROR(ReadNumber(node, "limits", key, value));
    if (*value < 1) return Got(Dotted("limits", key), "must be >= 1", *value);
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
                             const RequestLimits& limits, GenerationDefaults* d) const {
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
  RETURN_IF_ERROR(ReadString(node, "defaults", "scheduler", false, &d->scheduler));
  return CheckOneOf("defaults.scheduler", d->scheduler, {"ddim", "euler"});
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

Status Parser::ParseOffload(const YAML::Node& root, OffloadSpec* o) const {
  YAML::Node node;
  RETURN_IF_ERROR(GetSection(root, "", "offload", false, kOffloadKeys, &node));
  RETURN_IF_ERROR(ReadString(node, "offload", "policy", false, &o->policy));
  if (o->policy == "group") {
    return Got("offload.policy",
               "is not a policy: use sequential, whose group_mib sets how much is streamed together",
               "'" + o->policy + "'");
  }
  RETURN_IF_ERROR(CheckOneOf("offload.policy", o->policy, {"none", "model", "idle", "sequential"}));
  RETURN_IF_ERROR(ReadNumber(node, "offload", "idle_seconds", &o->idle_seconds));
  if (!(o->idle_seconds > 0) || o->idle_seconds > 7 * 24 * 3600) {
    return Got("offload.idle_seconds", "must be in (0, 604800]", o->idle_seconds);
  }
  RETURN_IF_ERROR(ReadNumber(node, "offload", "group_mib", &o->group_mib));
  if (!(o->group_mib >= 0) || o->group_mib > 65536) {
    return Got("offload.group_mib", "must be in [0, 65536]", o->group_mib);
  }
  RETURN_IF_ERROR(ReadNumber(node, "offload", "prefetch", &o->prefetch));
  if (o->prefetch < 0 || o->prefetch > 16) {
    return Got("offload.prefetch", "must be in [0, 16]", o->prefetch);
  }
  RETURN_IF_ERROR(ReadNumber(node, "offload", "resident_mib", &o->resident_mib));
  if (!(o->resident_mib >= 0) || o->resident_mib > 1048576) {
    return Got("offload.resident_mib", "must be in [0, 1048576]", o->resident_mib);
  }
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

StatusOr<PipelineManifest> Parser::Parse(const std::string& text) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) return InvalidArgument(StrCat(path_, ": invalid YAML: ", e.msg));
    return InvalidArgument(StrCat(path_, ": invalid YAML at line ", e.mark.line + 1, ", column ",
                                  e.mark.column + 1, ": ", e.msg));
  }
  if (docs.size() > 1) {
    return InvalidArgument(StrCat(path_, ": holds ", docs.size(), " YAML documents; expected one"));
  }
  const YAML::Node root = docs.empty() ? YAML::Node() : docs[0];
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
  if (RequiredComponents(m.kind).empty()) {
    return Got("kind", "names an unknown pipeline kind (supported: sd)", "'" + m.kind + "'");
  }
  RETURN_IF_ERROR(ParseComponents(root, &m));
  RETURN_IF_ERROR(ParseTokenizer(root, &m.tokenizer));
  RETURN_IF_ERROR(ParseScheduler(root, &m.scheduler));
  RETURN_IF_ERROR(ParseLatent(root, &m.latent));
  RETURN_IF_ERROR(ParseLimits(root, m.scheduler, &m.limits));
  RETURN_IF_ERROR(ParseDefaults(root, m.latent, m.limits, &m.defaults));
  RETURN_IF_ERROR(ParsePlacement(root, &m.placement));
  RETURN_IF_ERROR(ParseOffload(root, &m.offload));
  RETURN_IF_ERROR(ParseBatching(root, &m.batching));
  return m;
}

// Absolute, normalized, without a trailing separator.
std::string NormalizeDir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec);
  if (ec) p = fs::path(dir);
  p = p.lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p.string();
}

}  // namespace

const ComponentSpec* PipelineManifest::FindComponent(const std::string& component) const {
  for (const auto& c : components) {
    if (c.name == component) return &c;
  }
  return nullptr;
}

std::vector<std::string> RequiredComponents(const std::string& kind) {
  if (kind == "sd") return {"text_encoder", "unet", "vae_decoder"};
  return {};
}

StatusOr<PipelineManifest> ParseManifest(const std::string& yaml_text,
                                         const std::string& pipeline_dir) {
  const std::string dir = NormalizeDir(pipeline_dir);
  const std::string path = (fs::path(dir) / "pipeline.yaml").string();
  try {
    return Parser(dir, path).Parse(yaml_text);
  } catch (const std::exception& e) {  // yaml-cpp or filesystem surprises: still name the file.
    return InvalidArgument(StrCat(path, ": ", e.what()));
  }
}

StatusOr<PipelineManifest> LoadManifest(const std::string& pipeline_dir) {
  const std::string path = (fs::path(NormalizeDir(pipeline_dir)) / "pipeline.yaml").string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return NotFound(StrCat(path, ": manifest not found"));
  if (!fs::is_regular_file(st)) return InvalidArgument(StrCat(path, ": is not a regular file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(StrCat(path, ": cannot be opened for reading"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseManifest(text.str(), pipeline_dir);
}

}  // namespace qpool
