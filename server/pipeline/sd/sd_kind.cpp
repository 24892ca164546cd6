#include "pipeline/sd/sd_kind.h"

#include "pipeline/sd/sd_pipeline.h"

namespace qpool {

SdKind::SdKind()
    : components_{{"text_encoder", ComponentRole::kTextEncoder, {"input_ids"}},
                  {"unet",
                   ComponentRole::kDenoiser,
                   {"sample", "timestep", "encoder_hidden_states"},
                   1,
                   /*channels_last=*/true},
                  VaeDecoderDecl()} {}

StatusOr<std::unique_ptr<Pipeline>> SdKind::Load(const PipelineManifest& manifest,
                                                 const c10::Device& device, c10::ScalarType dtype,
                                                 const ResidencyContext& residency) const {
  ASSIGN_OR_RETURN(auto pipeline, SdPipeline::Load(*this, manifest, device, dtype, residency));
  return std::unique_ptr<Pipeline>(std::move(pipeline));
}

}  // namespace qpool
