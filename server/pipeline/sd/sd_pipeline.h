// SdPipeline: a Stable-Diffusion-1.x-shaped text-to-image pipeline (kind "sd"): CLIP tokenizer,
// text encoder, UNet denoiser with classifier-free guidance, DDIM/Euler schedulers, VAE decoder.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/tokenizer/clip_tokenizer.h"

namespace qpool {

// Thread safety: as Pipeline.
class SdPipeline final : public Pipeline {
 public:
  // Loads the tokenizer and the components (Pipeline::LoadComponents) of a manifest of `kind`.
  static StatusOr<std::unique_ptr<SdPipeline>> Load(const PipelineKind& kind,
                                                    const PipelineManifest& manifest,
                                                    const c10::Device& device,
                                                    c10::ScalarType dtype,
                                                    const ResidencyContext& residency);

  // Prompts are encoded, noise drawn and images decoded per request; the UNet runs once per step
  // for the whole batch, with each request's guidance scale on its own rows.
  void GenerateBatch(std::vector<BatchItem> items) override;
  StatusOr<EncodeOutput> Encode(const std::vector<std::string>& prompts) override;

 private:
  SdPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer tokenizer,
             c10::ScalarType dtype);
  torch::Tensor TokenIds(const std::vector<std::string>& texts) const;
  struct BatchRun;
  // Runs the text encoder on each group of texts in its own forward call; `next` (may be null)
  // is prefetched while it runs.
  StatusOr<std::vector<torch::Tensor>> EncodeTexts(
      const std::vector<std::vector<std::string>>& groups, Component* next);
  // Encodes every request's prompts into its context rows.
  Status EncodeBatch(BatchRun& run);
  // The denoising loop of the requests still running; cancelled ones are dropped at a step.
  Status DenoiseBatch(BatchRun& run);
  // Decodes each request's latents and hands it its images.
  Status DecodeBatch(BatchRun& run);
  // Decodes one request's latents.
  StatusOr<std::vector<GeneratedImage>> Decode(Component& decoder, const torch::Tensor& latents);

  ClipTokenizer tokenizer_;
};

}  // namespace qpool
