// HiDreamKind: kind "hidream", HiDream-I1-shaped pipelines (HiDreamImagePipeline): four text
// encoders, the last one an LLM, and a mixture-of-experts flow-matching transformer.
#pragma once

#include "pipeline/pipeline_kind.h"

namespace qpool {

class HiDreamKind final : public PipelineKind {
 public:
  HiDreamKind();
  const std::string& name() const override { return name_; }
  // text_encoder and text_encoder_2 (CLIP-L and CLIP-G, projected pooled outputs),
  // text_encoder_3 (T5 encoder, with the attention mask), text_encoder_4 (Llama, every layer's
  // hidden states), transformer, vae_decoder.
  const std::vector<ComponentDecl>& components() const override { return components_; }
  // tokenizer_2 (CLIP-G's BPE), tokenizer_3 (T5's SentencePiece model), tokenizer_4 (the
  // Llama's tokenizer.json), conditioning (padded_image_tokens).
  const std::vector<std::string>& manifest_sections() const override { return sections_; }
  ScheduleFamily schedule() const override { return ScheduleFamily::kFlowMatch; }
  std::map<std::string, TokenizerFormat> tokenizer_formats() const override {
    return {{"tokenizer_3", TokenizerFormat::kSentencePiece},
            {"tokenizer_4", TokenizerFormat::kTokenizerJson}};
  }
  // Classifier-free guidance when guidance_scale > 1; sides a multiple of 2 * latent.downscale
  // (the transformer's 2x2 patches); non-square images of at most
  // conditioning.padded_image_tokens patches.
  StatusOr<GenerateParams> ResolveGenerate(const GenerateRequestIn& in,
                                           const PipelineManifest& manifest) const override;
  // As flux's: the 16-channel VAE decode dominates a 1024x1024 image.
  double default_working_bytes_per_pixel() const override { return 6144; }
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                           const c10::Device& device, c10::ScalarType dtype,
                                           const ResidencyContext& residency) const override;

 private:
  const std::string name_ = "hidream";
  const std::vector<ComponentDecl> components_;
  const std::vector<std::string> sections_ = {"tokenizer_2", "tokenizer_3", "tokenizer_4",
                                              "conditioning"};
};

}  // namespace qpool
