// SdPipeline: a Stable-Diffusion-1.x-shaped text-to-image pipeline (kind "sd"): CLIP tokenizer,
// text encoder, UNet denoiser with classifier-free guidance, DDIM/Euler schedulers, VAE decoder.
// Kinds of the same shape with richer conditioning (sdxl) derive from it.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/tokenizer/clip_tokenizer.h"

namespace qpool {

// What the denoiser is conditioned on for some rows of a batch, one row per text: the text
// context and, for kinds that have one (sdxl), the pooled text embeddings, which the denoiser
// takes after the context.
struct Conditioning {
  torch::Tensor context;  // [rows, length, hidden]
  torch::Tensor pooled;   // [rows, dim] or undefined

  // Rows [begin, end).
  Conditioning Rows(int64_t begin, int64_t end) const;
  // One row repeated n times.
  Conditioning Expand(int64_t n) const;
  // The same shapes, all zeros.
  Conditioning Zeros() const;
};

// Thread safety: as Pipeline.
class SdPipeline : public Pipeline {
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

 protected:
  SdPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer tokenizer,
             c10::ScalarType dtype);

  // Runs `encoder` (a component whose forward returns `outputs` tensors, hidden states first) on
  // each group of texts in its own forward call, `next` (may be null) prefetched while it runs.
  // Checks the hidden states' shape [texts, max_length, hidden].
  StatusOr<std::vector<std::vector<torch::Tensor>>> RunTextEncoder(
      Component& encoder, const ClipTokenizer& tokenizer,
      const std::vector<std::vector<std::string>>& groups, size_t outputs, Component* next);
  // The conditioning of each group of texts, one row per text, on the device; `next` is
  // prefetched while the last text encoder runs. kind sd: the text encoder's hidden states.
  virtual StatusOr<std::vector<Conditioning>> EncodeTexts(
      const std::vector<std::vector<std::string>>& groups, Component* next);
  // The denoiser's inputs after the conditioning that depend on the request alone, one row
  // each, passed in their own dtype (sdxl: the size conditioning's time ids, float32: Note
  // [Tensors that keep their dtype]); none for kind sd.
  virtual std::vector<torch::Tensor> RequestInputs(const GenerateParams& params) const;

  const ClipTokenizer& tokenizer() const { return tokenizer_; }

 private:
  struct BatchRun;
  // Encodes every request's prompts into its context rows.
  Status EncodeBatch(BatchRun& run);
  // The denoising loop of the requests still running; cancelled ones are dropped at a step.
  Status DenoiseBatch(BatchRun& run);

  ClipTokenizer tokenizer_;
};

}  // namespace qpool
