// FluxKind: kind "flux", FLUX.1-shaped flow-matching pipelines (FluxPipeline).
#pragma once

#include "pipeline/pipeline_kind.h"

namespace qpool {

class FluxKind final : public PipelineKind {
 public:
  FluxKind();
  const std::string& name() const override { return name_; }
  // text_encoder (CLIP ViT-L, pooled output), text_encoder_2 (T5 encoder), transformer,
  // vae_decoder.
  const std::vector<ComponentDecl>& components() const override { return components_; }
  // tokenizer_2: T5's SentencePiece model.
  const std::vector<std::string>& manifest_sections() const override { return sections_; }
  ScheduleFamily schedule() const override { return ScheduleFamily::kFlowMatch; }
  std::map<std::string, TokenizerFormat> tokenizer_formats() const override {
    return {{"tokenizer_2", TokenizerFormat::kSentencePiece}};
  }
  // guidance_scale is the transformer's guidance input; classifier-free guidance only with
  // true_cfg_scale and a negative prompt; sizes are multiples of 16 (8x VAE, then 2x2 patches).
  StatusOr<GenerateParams> ResolveGenerate(const GenerateRequestIn& in,
                                           const PipelineManifest& manifest) const override;
  // ~6 GiB for one 1024x1024 image: the 16-channel VAE decode dominates.
  double default_working_bytes_per_pixel() const override { return 6144; }
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                           const c10::Device& device, c10::ScalarType dtype,
                                           const ResidencyContext& residency) const override;

 private:
  const std::string name_ = "flux";
  const std::vector<ComponentDecl> components_;
  const std::vector<std::string> sections_ = {"tokenizer_2"};
};

}  // namespace qpool
