#include "pipeline/hidream/hidream_pipeline.h"

#include "component/component.h"
#include "pipeline/batch_run.h"
#include "pipeline/scheduler/flow_unipc_scheduler.h"
#include "util/log.h"

namespace qpool {

struct HiDreamRequest : BatchRequest {
  torch::Tensor t5;      // [1, length, width]
  torch::Tensor llama;   // [layers, 1, length, width]
  torch::Tensor pooled;  // [1, dim]
  // Of the negative prompt, with classifier-free guidance.
  torch::Tensor uncond_t5;
  torch::Tensor uncond_llama;
  torch::Tensor uncond_pooled;
};

struct HiDreamPipeline::BatchRun : qpool::BatchRun<HiDreamRequest> {
  using qpool::BatchRun<HiDreamRequest>::BatchRun;

  // T5's states, the Llama's stack and the pooled embeddings of every running request,
  // num_images rows each; with CFG the negative prompts' rows first (BatchRun::Guide).
  std::vector<torch::Tensor> Conditioning(bool cfg) const {
    std::vector<torch::Tensor> t5, llama, pooled;
    for (int half = cfg ? 0 : 1; half < 2; ++half) {
      for (const auto& r : requests) {
        if (!r.running) continue;
        const int64_t n = r.item.params->num_images;
        t5.push_back((half == 0 ? r.uncond_t5 : r.t5).expand({n, -1, -1}));
        llama.push_back((half == 0 ? r.uncond_llama : r.llama).expand({-1, n, -1, -1}));
        pooled.push_back((half == 0 ? r.uncond_pooled : r.pooled).expand({n, -1}));
      }
    }
    return {torch::cat(t5).contiguous(), torch::cat(llama, 1).contiguous(),
            torch::cat(pooled).contiguous()};
  }
};

HiDreamPipeline::HiDreamPipeline(const PipelineKind& kind, PipelineManifest manifest,
                                 ClipTokenizer clip_l, ClipTokenizer clip_g,
                                 SentencePieceTokenizer t5, LlamaTokenizer llama,
                                 c10::ScalarType dtype)
    : Pipeline(kind, std::move(manifest), dtype),
      clip_l_(std::move(clip_l)),
      clip_g_(std::move(clip_g)),
      t5_(std::move(t5)),
      llama_(std::move(llama)) {}

StatusOr<std::unique_ptr<HiDreamPipeline>> HiDreamPipeline::Load(
    const PipelineKind& kind, const PipelineManifest& manifest, const c10::Device& device,
    c10::ScalarType dtype, const ResidencyContext& residency) {
  for (const auto& [key, section] : {std::pair{"tokenizer_2", &manifest.tokenizer_2},
                                     std::pair{"tokenizer_3", &manifest.tokenizer_3},
                                     std::pair{"tokenizer_4", &manifest.tokenizer_4}}) {
    if (!section->has_value()) {  // the parser requires them for this kind
      return InvalidArgument(StrCat(manifest.path, ": field '", key, "' is required"));
    }
  }
  const TokenizerSpec& t = manifest.tokenizer;
  ASSIGN_OR_RETURN(ClipTokenizer clip_l,
                   ClipTokenizer::Load(t.vocab, t.merges, t.max_length, t.pad_token));
  const TokenizerSpec& t2 = *manifest.tokenizer_2;
  ASSIGN_OR_RETURN(ClipTokenizer clip_g,
                   ClipTokenizer::Load(t2.vocab, t2.merges, t2.max_length, t2.pad_token));
  const TokenizerSpec& t3 = *manifest.tokenizer_3;
  ASSIGN_OR_RETURN(SentencePieceTokenizer t5,
                   SentencePieceTokenizer::Load(t3.model, t3.max_length));
  const TokenizerSpec& t4 = *manifest.tokenizer_4;
  LlamaTokenizer llama;
  ASSIGN_OR_RETURN(llama.bpe, BpeTokenizer::Load(t4.json));
  llama.length = t4.max_length;
  llama.pad_id = llama.bpe->TokenId(t4.pad_token);
  if (llama.pad_id < 0) {
    return InvalidArgument(StrCat(manifest.path, ": field 'tokenizer_4.pad_token' is '",
                                  t4.pad_token, "', which ", t4.json, " does not hold"));
  }
  std::unique_ptr<HiDreamPipeline> pipeline(new HiDreamPipeline(kind, manifest, std::move(clip_l),
                                                                std::move(clip_g), std::move(t5),
                                                                std::move(llama), dtype));
  RETURN_IF_ERROR(pipeline->LoadComponents(device, residency));
  // CUDA graphs for a transformer whose experts are grouped (Note [HiDream conditioning]).
  if (!GraphWaitsOnHost(pipeline->component("transformer").module())) {
    pipeline->UseForwardGraphs("transformer");
  }
  return pipeline;
}

StatusOr<torch::Tensor> HiDreamPipeline::Pooled(const std::string& name,
                                                const ClipTokenizer& tokenizer,
                                                const std::vector<std::string>& prompts,
                                                Component& next) {
  Component& clip = component(name);
  RETURN_IF_ERROR(residency().Use(clip));
  UseEncoderGraphs(clip);
  residency().Prefetch(next);
  ASSIGN_OR_RETURN(torch::Tensor pooled,
                   clip.Forward({PaddedTokenIds(tokenizer, prompts).to(device())}));
  const int64_t n = static_cast<int64_t>(prompts.size());
  if (pooled.dim() != 2 || pooled.size(0) != n) {
    return Internal(StrCat(name, " returned a pooled embedding of shape ", pooled.sizes(),
                           ", expected [", n, ", dim]"));
  }
  residency().Done(clip);
  return pooled;
}

StatusOr<HiDreamPipeline::Prompts> HiDreamPipeline::EncodePrompts(
    const std::vector<std::string>& prompts, Component* next) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  Component& t5 = component("text_encoder_3");
  Component& llama = component("text_encoder_4");
  ASSIGN_OR_RETURN(torch::Tensor pooled_l,
                   Pooled("text_encoder", clip_l_, prompts, component("text_encoder_2")));
  ASSIGN_OR_RETURN(torch::Tensor pooled_g, Pooled("text_encoder_2", clip_g_, prompts, t5));
  Prompts out;
  out.pooled = torch::cat({pooled_l, pooled_g}, -1);

  RETURN_IF_ERROR(residency().Use(t5));
  UseEncoderGraphs(t5);
  residency().Prefetch(llama);
  auto [t5_ids, t5_mask] = PaddedTokensAndMask(t5_, prompts);
  out.t5_ids = t5_ids;
  ASSIGN_OR_RETURN(out.t5, t5.Forward({t5_ids.to(device()), t5_mask.to(device())}));
  if (out.t5.dim() != 3 || out.t5.size(0) != n || out.t5.size(1) != t5_.max_length()) {
    return Internal(StrCat("text_encoder_3 returned hidden states of shape ", out.t5.sizes(),
                           ", expected [", n, ", ", t5_.max_length(), ", width]"));
  }
  residency().Done(t5);

  RETURN_IF_ERROR(residency().Use(llama));
  UseEncoderGraphs(llama);
  if (next != nullptr) residency().Prefetch(*next);
  auto [llama_ids, llama_mask] = PaddedTokensAndMask(llama_, prompts);
  out.llama_ids = llama_ids;
  ASSIGN_OR_RETURN(out.llama, llama.Forward({llama_ids.to(device()), llama_mask.to(device())}));
  if (out.llama.dim() != 4 || out.llama.size(1) != n || out.llama.size(2) != llama_.max_length()) {
    return Internal(StrCat("text_encoder_4 returned hidden states of shape ", out.llama.sizes(),
                           ", expected [layers, ", n, ", ", llama_.max_length(), ", width]"));
  }
  residency().Done(llama);
  out.pooled = out.pooled.to(dtype());
  out.t5 = out.t5.to(dtype());
  out.llama = out.llama.to(dtype());
  return out;
}

void HiDreamPipeline::GenerateBatch(std::vector<BatchItem> items) {
  RunStages(std::move(items), &HiDreamPipeline::EncodeBatch, &HiDreamPipeline::DenoiseBatch);
}

Status HiDreamPipeline::EncodeBatch(BatchRun& run) {
  // Every request's prompt, then the negative prompts ("" when absent) of those with
  // classifier-free guidance.
  std::vector<std::string> prompts;
  for (const auto& r : run.requests) prompts.push_back(r.item.params->prompt);
  for (const auto& r : run.requests) {
    if (r.item.params->do_cfg()) prompts.push_back(r.item.params->negative_prompt.value_or(""));
  }
  ASSIGN_OR_RETURN(Prompts encoded, EncodePrompts(prompts, &component("transformer")));
  run.MarkEncoded();
  int64_t negative = static_cast<int64_t>(run.requests.size());
  for (size_t i = 0; i < run.requests.size(); ++i) {
    auto& r = run.requests[i];
    const int64_t row = static_cast<int64_t>(i);
    r.t5 = encoded.t5.slice(0, row, row + 1);
    r.llama = encoded.llama.slice(1, row, row + 1);
    r.pooled = encoded.pooled.slice(0, row, row + 1);
    if (r.item.params->do_cfg()) {
      r.uncond_t5 = encoded.t5.slice(0, negative, negative + 1);
      r.uncond_llama = encoded.llama.slice(1, negative, negative + 1);
      r.uncond_pooled = encoded.pooled.slice(0, negative, negative + 1);
      ++negative;
    }
  }
  return Status::Ok();
}

torch::Tensor HiDreamPipeline::ImageMask(int64_t rows, int64_t tokens, int64_t padded,
                                         const c10::Device& device) const {
  torch::Tensor mask = torch::zeros({rows, padded}, torch::dtype(dtype()).device(device));
  mask.narrow(1, 0, tokens).fill_(1);
  return mask;
}

Status HiDreamPipeline::DenoiseBatch(BatchRun& run) {
  const GenerateParams& first = run.first();
  const auto& latent = manifest().latent;
  const int64_t h = first.height / latent.downscale;
  const int64_t w = first.width / latent.downscale;
  const int train_steps = manifest().scheduler.num_train_timesteps;
  ASSIGN_OR_RETURN(std::unique_ptr<FlowSampler> sampler,
                   MakeFlowSampler(first.scheduler, manifest().scheduler.flow,
                                   FlowSigmas::kScheduler, train_steps));
  FlowSampler& scheduler = *sampler;
  RETURN_IF_ERROR(scheduler.SetTimesteps(first.steps, (h / 2) * (w / 2)));
  // Non-square latents' patches are padded (ResolveGenerate checked that they fit).
  const int64_t tokens = (h / 2) * (w / 2);
  const int64_t padded = h == w ? tokens : manifest().conditioning.padded_image_tokens;

  const c10::Device device = this->device();
  torch::Tensor latents = run.Noise(latent.channels, h, w).to(device, dtype());
  // Requests of a batch all have CFG or none (BatchCompatible).
  const bool cfg = first.do_cfg();
  std::vector<torch::Tensor> conditioning = run.Conditioning(cfg);

  Component& transformer = component("transformer");
  RETURN_IF_ERROR(residency().Use(transformer));
  residency().Prefetch(component("vae_decoder"));
  const int total = scheduler.num_steps();
  torch::Tensor mask;
  for (int i = 0; i < total; ++i) {
    const int before = run.running();
    latents =
        run.DropCancelled(latents, [&](const torch::Tensor& rows) { scheduler.KeepRows(rows); });
    if (run.running() == 0) return Status::Ok();
    if (run.running() != before) conditioning = run.Conditioning(cfg);
    const torch::Tensor model_in = cfg ? torch::cat({latents, latents}) : latents;
    const torch::Tensor t = torch::full({model_in.size(0)}, scheduler.timestep(i) * train_steps,
                                        torch::dtype(torch::kFloat).device(device));
    if (!mask.defined() || mask.size(0) != model_in.size(0)) {  // rows change on cancellations
      mask = ImageMask(model_in.size(0), tokens, padded, device);
    }
    ASSIGN_OR_RETURN(torch::Tensor prediction,
                     transformer.Forward(
                         {model_in, t, conditioning[0], conditioning[1], conditioning[2], mask}));
    RETURN_IF_ERROR(CheckShape("transformer", prediction, model_in.sizes()));
    torch::Tensor velocity = prediction.neg();
    if (cfg) velocity = run.Guide(velocity);
    latents = scheduler.Step(velocity, i, latents);
    run.Progress(i + 1, total);
  }
  residency().Done(transformer);
  run.TakeLatents(latents, [](const torch::Tensor& rows) { return rows; });
  return Status::Ok();
}

StatusOr<EncodeOutput> HiDreamPipeline::Encode(const std::vector<std::string>& prompts) {
  c10::InferenceMode inference;
  RequestResidencyScope scope(residency());
  try {
    EncodeOutput out;
    ASSIGN_OR_RETURN(Prompts encoded, EncodePrompts(prompts, /*next=*/nullptr));
    out.input_ids = encoded.t5_ids;
    out.llm_input_ids = encoded.llama_ids;
    out.embeddings = encoded.t5.to(torch::kCPU, torch::kFloat).contiguous();
    out.pooled = encoded.pooled.to(torch::kCPU, torch::kFloat).contiguous();
    out.llm_embeddings = encoded.llama.to(torch::kCPU, torch::kFloat).contiguous();
    return out;
  } catch (const std::exception& e) {
    return TorchErrorStatus(StrCat("pipeline '", manifest().name, "'"), e);
  }
}

}  // namespace qpool
