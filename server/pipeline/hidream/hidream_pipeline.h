// HiDreamPipeline: a HiDream-I1-shaped text-to-image pipeline (kind "hidream"): two CLIPs'
// pooled embeddings, T5's token states and every layer's hidden states of a Llama condition a
// mixture-of-experts flow-matching transformer over 2x2 patches of the latent, sampled with flow
// matching's Euler or UniPC and decoded by the VAE.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/tokenizer/bpe_tokenizer.h"
#include "pipeline/tokenizer/clip_tokenizer.h"
#include "pipeline/tokenizer/sentencepiece_tokenizer.h"

namespace qpool {

// Note [HiDream conditioning]
// As diffusers' HiDreamImagePipeline with its max_sequence_length (the manifest's max_length of
// each tokenizer): the prompt goes through CLIP-L and CLIP-G (text_encoder, text_encoder_2: each
// its projected pooled embedding, concatenated), T5 (text_encoder_3: ids and attention mask,
// the last hidden state) and the Llama (text_encoder_4: ids padded on the right with the
// manifest's pad token and their attention mask, <|begin_of_text|> first; its hidden states
// after every layer, [layers, n, length, width]). The transformer takes the latents [B, C, h, w]
// (it patches them itself), the timestep (sigma * num_train_timesteps), T5's states, the Llama's
// stack, the pooled embedding and an image mask [B, S], and predicts the negated velocity: the
// pipeline negates it. The mask is all ones over the (h/2)(w/2) patches of a square image; a
// non-square image's patches are padded to S = conditioning.padded_image_tokens (the
// transformer's max_seq), the mask 0 over the padding, whose keys the transformer zeroes, as
// diffusers' HiDreamImageTransformer2DModel does for non-square latents.
// Classifier-free guidance when guidance_scale > 1: the negative prompt ("" when absent) runs
// through every encoder, its rows first, and the velocity is negative + guidance_scale *
// (positive - negative). The sigmas are the scheduler's own (FlowSigmas::kScheduler). The
// transformer replays CUDA graphs when its routed experts are grouped; per-expert ones (a
// quantized transformer's) wait for the GPU to count their tokens (Note [Routed experts] in
// hidream_experts.py), which no capture allows, and run eagerly. The encoders replay theirs.
//
// Thread safety: as Pipeline.
class HiDreamPipeline final : public Pipeline {
 public:
  static StatusOr<std::unique_ptr<HiDreamPipeline>> Load(const PipelineKind& kind,
                                                         const PipelineManifest& manifest,
                                                         const c10::Device& device,
                                                         c10::ScalarType dtype,
                                                         const ResidencyContext& residency);

  // Prompts are encoded, noise drawn and images decoded per request; the transformer runs once
  // per step for the whole batch, with each request's guidance on its own rows.
  void GenerateBatch(std::vector<BatchItem> items) override;
  // embeddings and input_ids: T5's; pooled: both CLIPs'; llm_embeddings and llm_input_ids: the
  // Llama's.
  StatusOr<EncodeOutput> Encode(const std::vector<std::string>& prompts) override;

 private:
  struct BatchRun;
  struct Prompts {
    torch::Tensor t5;         // [n, length, width]
    torch::Tensor llama;      // [layers, n, length, width]
    torch::Tensor pooled;     // [n, dim]
    torch::Tensor t5_ids;     // [n, length] on the host: the token ids the encoders took
    torch::Tensor llama_ids;  // [n, length] on the host
  };
  // The Llama's tokenizer as the pipeline calls it: padded to max_length with pad_id.
  struct LlamaTokenizer {
    std::unique_ptr<BpeTokenizer> bpe;
    int length = 0;
    int64_t pad_id = 0;
    int max_length() const { return length; }
    std::vector<int64_t> EncodePadded(const std::string& text, std::vector<int64_t>* mask) const {
      return bpe->EncodePadded(text, length, pad_id, mask);
    }
  };

  HiDreamPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer clip_l,
                  ClipTokenizer clip_g, SentencePieceTokenizer t5, LlamaTokenizer llama,
                  c10::ScalarType dtype);

  // Every encoder on `prompts`, each in one forward call; `next` (may be null) is prefetched
  // while the last one runs.
  StatusOr<Prompts> EncodePrompts(const std::vector<std::string>& prompts, Component* next);
  // A CLIP's pooled embedding of `prompts`, [n, dim].
  StatusOr<torch::Tensor> Pooled(const std::string& name, const ClipTokenizer& tokenizer,
                                 const std::vector<std::string>& prompts, Component& next);
  Status EncodeBatch(BatchRun& run);
  // The transformer's image_mask [rows, padded]: 1 for the image's `tokens` patches, 0 for the
  // padding after them.
  torch::Tensor ImageMask(int64_t rows, int64_t tokens, int64_t padded,
                          const c10::Device& device) const;
  Status DenoiseBatch(BatchRun& run);

  ClipTokenizer clip_l_;
  ClipTokenizer clip_g_;
  SentencePieceTokenizer t5_;
  LlamaTokenizer llama_;
};

}  // namespace qpool
