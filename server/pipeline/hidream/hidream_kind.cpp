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
                   {"latents", "timesteps", "t5", "llama", "pooled"}},
                  VaeDecoderDecl()} {}

StatusOr<GenerateParams> HiDreamKind::ResolveGenerate(const GenerateRequestIn& in,
                                                      const PipelineManifest& manifest) const {
  RequestFeatures features;
  features.schedule = ScheduleFamily::kFlowMatch;
  features.size_multiple = 2 * manifest.latent.downscale;
  ASSIGN_OR_RETURN(GenerateParams params, ResolveGenerateRequest(in, manifest, features));
  if (params.width != params.height) {
    return InvalidArgument(StrCat("width ", params.width, " and height ", params.height,
                                  ": pipelines of kind hidream make square images"));
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
