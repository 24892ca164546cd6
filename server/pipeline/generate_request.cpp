#include "pipeline/generate_request.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>

#include "util/log.h"

namespace qpool {
namespace {

// Request integers are uint32; anything past 2^30 is out of every limit anyway.
int Clamp(uint32_t v) { return static_cast<int>(std::min<uint32_t>(v, 1u << 30)); }

// What the client sent for a field (its own value, not the clamped one), for error messages.
int64_t Sent(const std::optional<uint32_t>& raw, int resolved) {
  return raw ? static_cast<int64_t>(*raw) : resolved;
}

Status CheckSize(const char* field, int value, int64_t sent, int limit, int multiple) {
  if (value < multiple || value % multiple != 0) {
    return InvalidArgument(
        StrCat(field, " must be a positive multiple of ", multiple, " (got ", sent, ")"));
  }
  if (value > limit) {
    return InvalidArgument(
        StrCat(field, " must be at most ", limit, " for this pipeline (got ", sent, ")"));
  }
  return Status::Ok();
}

Status ResolveSizeConditioning(const GenerateRequestIn& in, const PipelineManifest& manifest,
                               bool accepted, GenerateParams* p) {
  const std::tuple<const char*, const std::optional<uint32_t>&, int*, int, int> fields[] = {
      {"original_width", in.original_width, &p->size.original_width, p->width, 1},
      {"original_height", in.original_height, &p->size.original_height, p->height, 1},
      {"target_width", in.target_width, &p->size.target_width, p->width, 1},
      {"target_height", in.target_height, &p->size.target_height, p->height, 1},
      {"crop_top", in.crop_top, &p->size.crop_top, 0, 0},
      {"crop_left", in.crop_left, &p->size.crop_left, 0, 0}};
  for (const auto& [name, sent, out, fallback, min] : fields) {
    if (!sent.has_value()) {
      *out = fallback;
      continue;
    }
    if (!accepted) {
      return InvalidArgument(StrCat(name, " is size conditioning, which pipeline '", manifest.name,
                                    "' (kind ", manifest.kind, ") does not take"));
    }
    if (*sent < static_cast<uint32_t>(min) || *sent > static_cast<uint32_t>(kMaxConditioningSize)) {
      return InvalidArgument(StrCat(name, " must be between ", min, " and ", kMaxConditioningSize,
                                    " (got ", *sent, ")"));
    }
    *out = static_cast<int>(*sent);
  }
  return Status::Ok();
}

// A guidance scale the client sent (finite, in [0, 100]), or `fallback`.
Status ResolveScale(const char* field, const std::optional<float>& sent, double fallback,
                    double* out) {
  if (!sent.has_value()) {
    *out = fallback;
    return Status::Ok();
  }
  const float g = *sent;
  if (!std::isfinite(g) || g < 0) {
    return InvalidArgument(StrCat(field, " must be a finite number >= 0 (got ", g, ")"));
  }
  if (g > 100) return InvalidArgument(StrCat(field, " must be at most 100 (got ", g, ")"));
  *out = g;
  return Status::Ok();
}

}  // namespace

StatusOr<GenerateParams> ResolveGenerateRequest(const GenerateRequestIn& in,
                                                const PipelineManifest& manifest,
                                                const RequestFeatures& features) {
  const auto& defaults = manifest.defaults;
  const auto& limits = manifest.limits;
  GenerateParams p;
  if (in.prompt.size() > kMaxPromptBytes ||
      in.negative_prompt.value_or("").size() > kMaxPromptBytes) {
    return InvalidArgument(
        StrCat("prompt and negative_prompt must be at most ", kMaxPromptBytes, " bytes"));
  }
  p.prompt = in.prompt;
  p.negative_prompt = in.negative_prompt;

  p.steps = in.steps ? Clamp(*in.steps) : defaults.steps;
  if (p.steps < 1 || p.steps > limits.max_steps) {
    return InvalidArgument(StrCat("steps must be between 1 and ", limits.max_steps,
                                  " for pipeline '", manifest.name, "' (got ",
                                  Sent(in.steps, p.steps), ")"));
  }

  RETURN_IF_ERROR(ResolveScale("guidance_scale", in.guidance_scale,
                               manifest.defaults.guidance_scale, &p.guidance_scale));
  if (in.true_cfg_scale.has_value() && !features.embedded_guidance) {
    return InvalidArgument(StrCat("true_cfg_scale is for pipelines with embedded guidance; ",
                                  "pipeline '", manifest.name, "' (kind ", manifest.kind,
                                  ") takes classifier-free guidance from guidance_scale"));
  }
  RETURN_IF_ERROR(ResolveScale("true_cfg_scale", in.true_cfg_scale, 1.0, &p.true_cfg_scale));

  const int multiple = std::lcm(features.size_multiple, manifest.latent.downscale);
  p.width = in.width ? Clamp(*in.width) : defaults.width;
  p.height = in.height ? Clamp(*in.height) : defaults.height;
  RETURN_IF_ERROR(CheckSize("width", p.width, Sent(in.width, p.width), limits.max_width, multiple));
  RETURN_IF_ERROR(
      CheckSize("height", p.height, Sent(in.height, p.height), limits.max_height, multiple));

  RETURN_IF_ERROR(ResolveSizeConditioning(in, manifest, features.size_conditioning, &p));
  p.embedded_guidance = features.embedded_guidance;

  p.num_images = in.num_images ? Clamp(*in.num_images) : 1;
  if (p.num_images < 1 || p.num_images > limits.max_images) {
    return InvalidArgument(StrCat("num_images must be between 1 and ", limits.max_images,
                                  " for pipeline '", manifest.name, "' (got ",
                                  Sent(in.num_images, p.num_images), ")"));
  }

  p.scheduler = in.scheduler.empty() ? defaults.scheduler : in.scheduler;
  const std::vector<std::string>& samplers = SamplerNames(features.schedule);
  if (std::find(samplers.begin(), samplers.end(), p.scheduler) == samplers.end()) {
    std::string valid;
    for (const auto& name : samplers) valid += (valid.empty() ? "" : ", ") + name;
    return InvalidArgument(StrCat("unknown scheduler '", Abbreviate(p.scheduler),
                                  "'; valid schedulers: ", valid, " (pipeline '", manifest.name,
                                  "', kind ", manifest.kind, ")"));
  }

  if (in.seed.has_value()) {
    p.seed = *in.seed;
  } else {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    // Keep seeds below 2^53 so JSON clients read them back exactly.
    p.seed = rng() & ((uint64_t{1} << 53) - 1);
  }
  return p;
}

Status ValidateEncodePrompts(const std::vector<std::string>& prompts,
                             const PipelineManifest& manifest) {
  const size_t num_prompts = prompts.size();
  if (num_prompts == 0) return InvalidArgument("prompts must hold at least one prompt");
  if (num_prompts > static_cast<size_t>(manifest.limits.max_prompts)) {
    return InvalidArgument(StrCat("at most ", manifest.limits.max_prompts,
                                  " prompts per Encode request for pipeline '", manifest.name,
                                  "' (got ", num_prompts, ")"));
  }
  for (size_t i = 0; i < num_prompts; ++i) {
    if (prompts[i].size() > kMaxPromptBytes) {
      return InvalidArgument(StrCat("prompts[", i, "] must be at most ", kMaxPromptBytes,
                                    " bytes (got ", prompts[i].size(), ")"));
    }
  }
  return Status::Ok();
}

bool BatchCompatible(const GenerateParams& a, const GenerateParams& b) {
  return a.width == b.width && a.height == b.height && a.steps == b.steps &&
         a.scheduler == b.scheduler && a.do_cfg() == b.do_cfg();
}

}  // namespace qpool
