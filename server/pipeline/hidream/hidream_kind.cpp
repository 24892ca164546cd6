#include "pipeline/hidream/hidream_kind.h"

#include "pipeline/hidream/hidream_pipeline.h"
#include "util/log.h"

namespace qpool {

HiDreamKind::HiDreamKind()
    : components_{{"text_encoder", ComponentRole::kTextEncoder, {"input_ids"}},
                  {"text_encoder_2", ComponentRole::kTextEncoder, {"input_ids"}},
                  {"text_encoder_3", ComponentRole::kTextEncoder, {"input_ids", "attention_mask"}},
                  {"text_encoder_4", ComponentRole::kTextEncoder, {"input_ids", "attention_mask"}},
                  {"transformer",
                   ComponentRole::kDenoiser,
                   {"latents", "timesteps", "t5", "llama", "pooled", "image_mask"}},
                  VaeDecoderDecl()} {}

StatusOr<GenerateParams> HiDreamKind::ResolveGenerate(const GenerateRequestIn& in,
                                                      const PipelineManifest& manifest) const {
  RequestFeatures features;
  features.schedule = ScheduleFamily::kFlowMatch;
  features.size_multiple = 2 * manifest.latent.downscale;
  ASSIGN_OR_RETURN(GenerateParams params, ResolveGenerateRequest(in, manifest, features));
  if (params.width == params.height) return params;
  const int padded = manifest.conditioning.padded_image_tokens;
  const int64_t patch = features.size_multiple;
  const int64_t tokens = (params.width / patch) * (params.height / patch);
  if (padded == 0) {
    return InvalidArgument(StrCat("width ", params.width, " and height ", params.height,
                                  ": pipeline '", manifest.name,
                                  "' makes square images only (its manifest has no "
                                  "conditioning.padded_image_tokens; import it again)"));
  }
  if (tokens > padded) {
    return InvalidArgument(StrCat("width ", params.width, " and height ", params.height, ": ",
                                  tokens, " patches of ", patch, "x", patch, " pixels; pipeline '",
                                  manifest.name, "' pads non-square images to ", padded,
                                  " (at most ", padded * patch * patch, " pixels)"));
  }
  return params;
}

StatusOr<std::unique_ptr<Pipeline>> HiDreamKind::Load(const PipelineManifest& manifest,
                                                      const c10::Device& device,
                                                      c10::ScalarType dtype,
                                                      const ResidencyContext& residency) const {
  ASSIGN_OR_RETURN(auto pipeline, HiDreamPipeline::Load(*this, manifest, device, dtype, residency));
  return std::unique_ptr<Pipeline>(std::move(pipeline));
}

}  // namespace qpool
