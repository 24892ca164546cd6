// FluxPipeline: a FLUX.1-shaped text-to-image pipeline (kind "flux"): CLIP's pooled prompt
// embedding and T5's token embeddings condition a flow-matching transformer over 2x2 patches of
// a 16-channel latent, sampled with flow matching's Euler or UniPC and decoded by the VAE.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/tokenizer/clip_tokenizer.h"
#include "pipeline/tokenizer/sentencepiece_tokenizer.h"

namespace qpool {

// Note [FLUX conditioning]
// As diffusers' FluxPipeline: the prompt goes through CLIP (77 tokens; the pooled output at the
// end-of-text token, text_encoder's only output) and T5 (tokenizer_2.max_length tokens, no
// attention mask; text_encoder_2's last hidden state). The transformer takes the packed latents
// [B, (h/2)(w/2), 4 C], the T5 states, the pooled embedding, the timestep (the sigma, float32),
// the position ids of the image tokens (0, row, column) and of the text tokens (zeros), and the
// guidance scale (float32; a guidance-distilled model embeds it, others ignore it): one
// transformer call per step. Classifier-free guidance on top of it ("true CFG", diffusers'
// true_cfg_scale) runs when a request has a negative prompt and true_cfg_scale > 1: the
// negative prompt's rows join the batch, with the same guidance input, and the velocity is
// negative + true_cfg_scale * (positive - negative). A negative prompt alone changes nothing.
// Packing (Pack/Unpack) is diffusers' _pack_latents: each 2x2 patch of the latent becomes one
// token of 4 C channels, channel-major.
//
// Thread safety: as Pipeline.
class FluxPipeline final : public Pipeline {
 public:
  static StatusOr<std::unique_ptr<FluxPipeline>> Load(const PipelineKind& kind,
                                                      const PipelineManifest& manifest,
                                                      const c10::Device& device,
                                                      c10::ScalarType dtype,
                                                      const ResidencyContext& residency);

  // Prompts are encoded, noise drawn and images decoded per request; the transformer runs once
  // per step for the whole batch, with each request's guidance on its own rows.
  void GenerateBatch(std::vector<BatchItem> items) override;
  // embeddings: T5's states [n, tokenizer_2.max_length, hidden]; input_ids: T5's ids; pooled:
  // CLIP's pooled embedding [n, dim].
  StatusOr<EncodeOutput> Encode(const std::vector<std::string>& prompts) override;

  // [n, C, h, w] (h, w even) -> [n, (h/2)(w/2), 4 C], and back.
  static torch::Tensor Pack(const torch::Tensor& latents);
  static torch::Tensor Unpack(const torch::Tensor& packed, int64_t h, int64_t w);
  // The position ids of the image tokens of an h x w latent, float32 [(h/2)(w/2), 3].
  static torch::Tensor ImageIds(int64_t h, int64_t w);

 private:
  struct BatchRun;
  struct Prompts {
    torch::Tensor context;  // T5's states [n, length, hidden]
    torch::Tensor pooled;   // CLIP's pooled embedding [n, dim]
  };

  FluxPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer clip,
               SentencePieceTokenizer t5, c10::ScalarType dtype);

  // Both encoders on `prompts`, each in one forward call; `next` (may be null) is prefetched
  // while the last one runs.
  StatusOr<Prompts> EncodePrompts(const std::vector<std::string>& prompts, Component* next);
  // Both encoders on every request's prompt, in one forward call each.
  Status EncodeBatch(BatchRun& run);
  Status DenoiseBatch(BatchRun& run);

  ClipTokenizer clip_;
  SentencePieceTokenizer t5_;
};

}  // namespace qpool
