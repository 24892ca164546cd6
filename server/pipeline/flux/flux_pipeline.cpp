#include "pipeline/flux/flux_pipeline.h"

#include "pipeline/batch_run.h"
#include "pipeline/scheduler/flow_unipc_scheduler.h"
#include "util/log.h"

namespace qpool {

struct FluxRequest : BatchRequest {
  torch::Tensor context;         // [1, length, hidden]
  torch::Tensor pooled;          // [1, dim]
  torch::Tensor uncond_context;  // of the negative prompt, with classifier-free guidance
  torch::Tensor uncond_pooled;
};

struct FluxPipeline::BatchRun : qpool::BatchRun<FluxRequest> {
  using qpool::BatchRun<FluxRequest>::BatchRun;

  // Rows of every running request: its context, pooled embedding and guidance, num_images
  // each; with CFG the negative prompts' rows first, then the prompts' (BatchRun::Guide).
  std::vector<torch::Tensor> Conditioning(const c10::Device& device, bool cfg) const {
    std::vector<torch::Tensor> context, pooled, guidance;
    for (int half = cfg ? 0 : 1; half < 2; ++half) {
      for (const auto& r : requests) {
        if (!r.running) continue;
        const int64_t n = r.item.params->num_images;
        context.push_back((half == 0 ? r.uncond_context : r.context).expand({n, -1, -1}));
        pooled.push_back((half == 0 ? r.uncond_pooled : r.pooled).expand({n, -1}));
        guidance.push_back(torch::full({n}, r.item.params->guidance_scale, torch::kFloat));
      }
    }
    return {torch::cat(context).contiguous(), torch::cat(pooled).contiguous(),
            torch::cat(guidance).to(device)};
  }
};

FluxPipeline::FluxPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer clip,
                           SentencePieceTokenizer t5, c10::ScalarType dtype)
    : Pipeline(kind, std::move(manifest), dtype), clip_(std::move(clip)), t5_(std::move(t5)) {}

StatusOr<std::unique_ptr<FluxPipeline>> FluxPipeline::Load(const PipelineKind& kind,
                                                           const PipelineManifest& manifest,
                                                           const c10::Device& device,
                                                           c10::ScalarType dtype,
                                                           const ResidencyContext& residency) {
  if (!manifest.tokenizer_2.has_value()) {  // the parser requires it for this kind
    return InvalidArgument(StrCat(manifest.path, ": field 'tokenizer_2' is required"));
  }
  const TokenizerSpec& t = manifest.tokenizer;
  ASSIGN_OR_RETURN(ClipTokenizer clip,
                   ClipTokenizer::Load(t.vocab, t.merges, t.max_length, t.pad_token));
  const TokenizerSpec& t2 = *manifest.tokenizer_2;
  ASSIGN_OR_RETURN(SentencePieceTokenizer t5,
                   SentencePieceTokenizer::Load(t2.model, t2.max_length));
  std::unique_ptr<FluxPipeline> pipeline(
      new FluxPipeline(kind, manifest, std::move(clip), std::move(t5), dtype));
  RETURN_IF_ERROR(pipeline->LoadComponents(device, residency));
  pipeline->UseForwardGraphs("transformer");
  return pipeline;
}

torch::Tensor FluxPipeline::Pack(const torch::Tensor& latents) {
  const int64_t n = latents.size(0), c = latents.size(1);
  const int64_t h = latents.size(2), w = latents.size(3);
  return latents.view({n, c, h / 2, 2, w / 2, 2})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({n, (h / 2) * (w / 2), c * 4});
}

torch::Tensor FluxPipeline::Unpack(const torch::Tensor& packed, int64_t h, int64_t w) {
  const int64_t n = packed.size(0), c = packed.size(2) / 4;
  return packed.view({n, h / 2, w / 2, c, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({n, c, h, w});
}

torch::Tensor FluxPipeline::ImageIds(int64_t h, int64_t w) {
  auto ids = torch::zeros({h / 2, w / 2, 3}, torch::kFloat);
  ids.select(2, 1).add_(torch::arange(h / 2, torch::kFloat).unsqueeze(1));
  ids.select(2, 2).add_(torch::arange(w / 2, torch::kFloat).unsqueeze(0));
  return ids.reshape({(h / 2) * (w / 2), 3});
}

StatusOr<FluxPipeline::Prompts> FluxPipeline::EncodePrompts(const std::vector<std::string>& prompts,
                                                            Component* next) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  Component& clip = component("text_encoder");
  Component& t5 = component("text_encoder_2");
  Prompts out;
  RETURN_IF_ERROR(residency().Use(clip));
  UseEncoderGraphs(clip);
  residency().Prefetch(t5);
  ASSIGN_OR_RETURN(out.pooled, clip.Forward({PaddedTokenIds(clip_, prompts).to(device())}));
  if (out.pooled.dim() != 2 || out.pooled.size(0) != n) {
    return Internal(StrCat("text_encoder returned a pooled embedding of shape ", out.pooled.sizes(),
                           ", expected [", n, ", dim]"));
  }
  residency().Done(clip);
  RETURN_IF_ERROR(residency().Use(t5));
  UseEncoderGraphs(t5);
  if (next != nullptr) residency().Prefetch(*next);
  ASSIGN_OR_RETURN(out.context, t5.Forward({PaddedTokenIds(t5_, prompts).to(device())}));
  if (out.context.dim() != 3 || out.context.size(0) != n ||
      out.context.size(1) != t5_.max_length()) {
    return Internal(StrCat("text_encoder_2 returned hidden states of shape ", out.context.sizes(),
                           ", expected [", n, ", ", t5_.max_length(), ", hidden]"));
  }
  residency().Done(t5);
  out.pooled = out.pooled.to(dtype());
  out.context = out.context.to(dtype());
  return out;
}

void FluxPipeline::GenerateBatch(std::vector<BatchItem> items) {
  RunStages(std::move(items), &FluxPipeline::EncodeBatch, &FluxPipeline::DenoiseBatch);
}

Status FluxPipeline::EncodeBatch(BatchRun& run) {
  // Every request's prompt, then the negative prompts of those with classifier-free guidance.
  std::vector<std::string> prompts;
  for (const auto& r : run.requests) prompts.push_back(r.item.params->prompt);
  for (const auto& r : run.requests) {
    if (r.item.params->do_cfg()) prompts.push_back(*r.item.params->negative_prompt);
  }
  ASSIGN_OR_RETURN(Prompts encoded, EncodePrompts(prompts, &component("transformer")));
  run.MarkEncoded();
  int64_t negative = static_cast<int64_t>(run.requests.size());
  for (size_t i = 0; i < run.requests.size(); ++i) {
    auto& r = run.requests[i];
    r.context = encoded.context.slice(0, i, i + 1);
    r.pooled = encoded.pooled.slice(0, i, i + 1);
    if (r.item.params->do_cfg()) {
      r.uncond_context = encoded.context.slice(0, negative, negative + 1);
      r.uncond_pooled = encoded.pooled.slice(0, negative, negative + 1);
      ++negative;
    }
  }
  return Status::Ok();
}

Status FluxPipeline::DenoiseBatch(BatchRun& run) {
  const GenerateParams& first = run.first();
  const auto& latent = manifest().latent;
  const int64_t h = first.height / latent.downscale;
  const int64_t w = first.width / latent.downscale;
  ASSIGN_OR_RETURN(
      std::unique_ptr<FlowSampler> sampler,
      MakeFlowSampler(first.scheduler, manifest().scheduler.flow, FlowSigmas::kFluxPipeline,
                      manifest().scheduler.num_train_timesteps));
  FlowSampler& scheduler = *sampler;
  RETURN_IF_ERROR(scheduler.SetTimesteps(first.steps, (h / 2) * (w / 2)));

  const c10::Device device = this->device();
  torch::Tensor latents = Pack(run.Noise(latent.channels, h, w)).to(device, dtype());
  const torch::Tensor img_ids = ImageIds(h, w).to(device);
  const torch::Tensor txt_ids =
      torch::zeros({run.requests.front().context.size(1), 3}, torch::kFloat).to(device);
  // Requests of a batch all have CFG or none (BatchCompatible).
  const bool cfg = first.do_cfg();
  std::vector<torch::Tensor> conditioning = run.Conditioning(device, cfg);

  Component& transformer = component("transformer");
  RETURN_IF_ERROR(residency().Use(transformer));
  residency().Prefetch(component("vae_decoder"));
  const int total = scheduler.num_steps();
  for (int i = 0; i < total; ++i) {
    const int before = run.running();
    latents =
        run.DropCancelled(latents, [&](const torch::Tensor& rows) { scheduler.KeepRows(rows); });
    if (run.running() == 0) return Status::Ok();
    if (run.running() != before) conditioning = run.Conditioning(device, cfg);
    const torch::Tensor model_in = cfg ? torch::cat({latents, latents}) : latents;
    const torch::Tensor t = torch::full({model_in.size(0)}, scheduler.timestep(i),
                                        torch::dtype(torch::kFloat).device(device));
    ASSIGN_OR_RETURN(torch::Tensor velocity,
                     transformer.Forward({model_in, conditioning[0], conditioning[1], t, img_ids,
                                          txt_ids, conditioning[2]}));
    RETURN_IF_ERROR(CheckShape("transformer", velocity, model_in.sizes()));
    if (cfg) velocity = run.Guide(velocity);
    latents = scheduler.Step(velocity, i, latents);
    run.Progress(i + 1, total);
  }
  residency().Done(transformer);
  run.TakeLatents(latents, [&](const torch::Tensor& rows) { return Unpack(rows, h, w); });
  return Status::Ok();
}

StatusOr<EncodeOutput> FluxPipeline::Encode(const std::vector<std::string>& prompts) {
  c10::InferenceMode inference;
  RequestResidencyScope scope(residency());
  try {
    EncodeOutput out;
    out.input_ids = PaddedTokenIds(t5_, prompts);
    ASSIGN_OR_RETURN(Prompts encoded, EncodePrompts(prompts, /*next=*/nullptr));
    out.embeddings = encoded.context.to(torch::kCPU, torch::kFloat).contiguous();
    out.pooled = encoded.pooled.to(torch::kCPU, torch::kFloat).contiguous();
    return out;
  } catch (const std::exception& e) {
    return TorchErrorStatus(StrCat("pipeline '", manifest().name, "'"), e);
  }
}

}  // namespace qpool
