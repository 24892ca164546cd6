#include "pipeline/sdxl/sdxl_kind.h"

#include "pipeline/sdxl/sdxl_pipeline.h"

namespace qpool {

SdxlKind::SdxlKind()
    : components_{{"text_encoder", ComponentRole::kTextEncoder, {"input_ids"}},
                  {"text_encoder_2", ComponentRole::kTextEncoder, {"input_ids"}, 2},
                  {"unet",
                   ComponentRole::kDenoiser,
                   {"sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"},
                   1,
                   /*channels_last=*/true},
                  VaeDecoderDecl()} {}

StatusOr<GenerateParams> SdxlKind::ResolveGenerate(const GenerateRequestIn& in,
                                                   const PipelineManifest& manifest) const {
  RequestFeatures features;
  features.size_conditioning = true;
  return ResolveGenerateRequest(in, manifest, features);
}

StatusOr<std::unique_ptr<Pipeline>> SdxlKind::Load(const PipelineManifest& manifest,
                                                   const c10::Device& device, c10::ScalarType dtype,
                                                   const ResidencyContext& residency) const {
  ASSIGN_OR_RETURN(auto pipeline, SdxlPipeline::Load(*this, manifest, device, dtype, residency));
  return std::unique_ptr<Pipeline>(std::move(pipeline));
}

}  // namespace qpool
