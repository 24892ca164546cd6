// SdxlKind: kind "sdxl", Stable-Diffusion-XL-shaped pipelines (SdxlPipeline).
#pragma once

#include "pipeline/pipeline_kind.h"

namespace qpool {

class SdxlKind final : public PipelineKind {
 public:
  SdxlKind();
  const std::string& name() const override { return name_; }
  // text_encoder (CLIP ViT-L), text_encoder_2 (OpenCLIP ViT-bigG with projection), unet,
  // vae_decoder.
  const std::vector<ComponentDecl>& components() const override { return components_; }
  // tokenizer_2 and conditioning.
  const std::vector<std::string>& manifest_sections() const override { return sections_; }
  // Takes the size conditioning (original/target size, crop).
  StatusOr<GenerateParams> ResolveGenerate(const GenerateRequestIn& in,
                                           const PipelineManifest& manifest) const override;
  // ~8 GiB for one 1024x1024 image: what a float32 SDXL VAE decode needs.
  double default_working_bytes_per_pixel() const override { return 8192; }
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                           const c10::Device& device, c10::ScalarType dtype,
                                           const ResidencyContext& residency) const override;

 private:
  const std::string name_ = "sdxl";
  const std::vector<ComponentDecl> components_;
  const std::vector<std::string> sections_ = {"tokenizer_2", "conditioning"};
};

}  // namespace qpool
