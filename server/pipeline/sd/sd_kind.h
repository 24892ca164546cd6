// SdKind: kind "sd", Stable-Diffusion-1.x-shaped pipelines (SdPipeline).
#pragma once

#include "pipeline/pipeline_kind.h"

namespace qpool {

class SdKind final : public PipelineKind {
 public:
  SdKind();
  const std::string& name() const override { return name_; }
  // text_encoder (CLIP), unet, vae_decoder.
  const std::vector<ComponentDecl>& components() const override { return components_; }
  // ~1 GiB for one 512x512 image: what an fp16 SD 1.5 VAE decode needs.
  double default_working_bytes_per_pixel() const override { return 4096; }
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                           const c10::Device& device, c10::ScalarType dtype,
                                           const ResidencyContext& residency) const override;

 private:
  const std::string name_ = "sd";
  const std::vector<ComponentDecl> components_;
};

}  // namespace qpool
