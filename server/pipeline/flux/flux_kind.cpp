#include "pipeline/flux/flux_kind.h"

#include "pipeline/flux/flux_pipeline.h"

namespace qpool {

FluxKind::FluxKind()
    : components_{{"text_encoder", ComponentRole::kTextEncoder, {"input_ids"}},
                  {"text_encoder_2", ComponentRole::kTextEncoder, {"input_ids"}},
                  {"transformer",
                   ComponentRole::kDenoiser,
                   {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep",
                    "img_ids", "txt_ids", "guidance"}},
                  VaeDecoderDecl()} {}

StatusOr<GenerateParams> FluxKind::ResolveGenerate(const GenerateRequestIn& in,
                                                   const PipelineManifest& manifest) const {
  RequestFeatures features;
  features.embedded_guidance = true;
  features.schedule = ScheduleFamily::kFlowMatch;
  features.size_multiple = 2 * manifest.latent.downscale;
  return ResolveGenerateRequest(in, manifest, features);
}

StatusOr<std::unique_ptr<Pipeline>> FluxKind::Load(const PipelineManifest& manifest,
                                                   const c10::Device& device, c10::ScalarType dtype,
                                                   const ResidencyContext& residency) const {
  ASSIGN_OR_RETURN(auto pipeline, FluxPipeline::Load(*this, manifest, device, dtype, residency));
  return std::unique_ptr<Pipeline>(std::move(pipeline));
}

}  // namespace qpool
