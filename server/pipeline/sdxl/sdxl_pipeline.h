// SdxlPipeline: a Stable-Diffusion-XL-shaped text-to-image pipeline (kind "sdxl"): SdPipeline's
// loop with two CLIP text encoders, pooled text embeddings and size conditioning.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pipeline/sd/sd_pipeline.h"

namespace qpool {

// Note [SDXL conditioning]
// As diffusers' StableDiffusionXLPipeline: each prompt is tokenized by both tokenizers; the
// context is text_encoder's hidden states concatenated with text_encoder_2's along the hidden
// axis (each component returns the layer diffusers reads, the penultimate by default), and the
// pooled embeddings are text_encoder_2's second output. The UNet takes (latents, timesteps,
// context, pooled, time ids), time ids being [original height, original width, crop top, crop
// left, target height, target width] (SizeConditioning), the same for both halves of a CFG
// batch. An empty negative prompt is zeros when the manifest says force_zeros_for_empty_prompt
// (SdPipeline::EncodeBatch).
//
// Thread safety: as Pipeline.
class SdxlPipeline final : public SdPipeline {
 public:
  // Loads both tokenizers and the components of a manifest of `kind`.
  static StatusOr<std::unique_ptr<SdxlPipeline>> Load(const PipelineKind& kind,
                                                      const PipelineManifest& manifest,
                                                      const c10::Device& device,
                                                      c10::ScalarType dtype,
                                                      const ResidencyContext& residency);

 protected:
  StatusOr<std::vector<Conditioning>> EncodeTexts(
      const std::vector<std::vector<std::string>>& groups, Component* next) override;
  // The time ids, [1, 6].
  std::vector<torch::Tensor> RequestInputs(const GenerateParams& params) const override;

 private:
  SdxlPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer tokenizer,
               ClipTokenizer tokenizer_2, c10::ScalarType dtype);

  ClipTokenizer tokenizer_2_;
};

}  // namespace qpool
