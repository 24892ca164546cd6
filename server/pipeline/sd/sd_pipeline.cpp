#include "pipeline/sd/sd_pipeline.h"

#include "pipeline/batch_run.h"
#include "pipeline/scheduler/scheduler.h"
#include "util/log.h"

namespace qpool {
namespace {

// One row repeated n times (a view).
torch::Tensor ExpandRows(const torch::Tensor& row, int64_t n) {
  std::vector<int64_t> sizes = row.sizes().vec();
  sizes[0] = n;
  return row.expand(sizes);
}

torch::Tensor SliceIfDefined(const torch::Tensor& t, int64_t begin, int64_t end) {
  return t.defined() ? t.slice(0, begin, end) : t;
}

}  // namespace

Conditioning Conditioning::Rows(int64_t begin, int64_t end) const {
  return {context.slice(0, begin, end), SliceIfDefined(pooled, begin, end)};
}

Conditioning Conditioning::Expand(int64_t n) const {
  return {ExpandRows(context, n), pooled.defined() ? ExpandRows(pooled, n) : pooled};
}

Conditioning Conditioning::Zeros() const {
  return {torch::zeros_like(context), pooled.defined() ? torch::zeros_like(pooled) : pooled};
}

SdPipeline::SdPipeline(const PipelineKind& kind, PipelineManifest manifest, ClipTokenizer tokenizer,
                       c10::ScalarType dtype)
    : Pipeline(kind, std::move(manifest), dtype), tokenizer_(std::move(tokenizer)) {}

StatusOr<std::unique_ptr<SdPipeline>> SdPipeline::Load(const PipelineKind& kind,
                                                       const PipelineManifest& manifest,
                                                       const c10::Device& device,
                                                       c10::ScalarType dtype,
                                                       const ResidencyContext& residency) {
  ASSIGN_OR_RETURN(
      ClipTokenizer tokenizer,
      ClipTokenizer::Load(manifest.tokenizer.vocab, manifest.tokenizer.merges,
                          manifest.tokenizer.max_length, manifest.tokenizer.pad_token));
  std::unique_ptr<SdPipeline> pipeline(new SdPipeline(kind, manifest, std::move(tokenizer), dtype));
  RETURN_IF_ERROR(pipeline->LoadComponents(device, residency));
  pipeline->UseForwardGraphs("unet");
  return pipeline;
}

// The requests of one GenerateBatch call (Note [The last result waits for the residency] in
// pipeline/batch_run.h). With CFG the UNet sees [latents, latents] against the conditioning
// [uncond rows of every request, cond rows of every request].
struct SdRequest : BatchRequest {
  Conditioning uncond;                // n rows with CFG, else undefined
  Conditioning cond;                  // n rows
  std::vector<torch::Tensor> inputs;  // RequestInputs, n rows each
};

struct SdPipeline::BatchRun : qpool::BatchRun<SdRequest> {
  using qpool::BatchRun<SdRequest>::BatchRun;

  // The denoiser's inputs after (latents, timesteps): the context, the pooled embeddings if the
  // kind has them, then the request inputs, each with the rows of every running request.
  std::vector<torch::Tensor> DenoiserInputs(bool cfg) const {
    std::vector<torch::Tensor> context;
    std::vector<torch::Tensor> pooled;
    std::vector<std::vector<torch::Tensor>> inputs;
    auto add = [&](const SdRequest& r, const Conditioning& c) {
      context.push_back(c.context);
      if (c.pooled.defined()) pooled.push_back(c.pooled);
      inputs.resize(r.inputs.size());
      for (size_t k = 0; k < r.inputs.size(); ++k) inputs[k].push_back(r.inputs[k]);
    };
    for (int half = cfg ? 0 : 1; half < 2; ++half) {
      for (const auto& r : requests) {
        if (r.running) add(r, half == 0 ? r.uncond : r.cond);
      }
    }
    std::vector<torch::Tensor> out{torch::cat(context).contiguous()};
    if (!pooled.empty()) out.push_back(torch::cat(pooled).contiguous());
    for (auto& rows : inputs) out.push_back(torch::cat(rows).contiguous());
    return out;
  }
};

StatusOr<std::vector<std::vector<torch::Tensor>>> SdPipeline::RunTextEncoder(
    Component& encoder, const ClipTokenizer& tokenizer,
    const std::vector<std::vector<std::string>>& groups, size_t outputs, Component* next) {
  RETURN_IF_ERROR(residency().Use(encoder));
  UseEncoderGraphs(encoder);
  // Queued on the copy stream after the encoder's own copy, so it overlaps the encoding instead
  // of delaying it.
  if (next != nullptr) residency().Prefetch(*next);
  std::vector<std::vector<torch::Tensor>> out;
  for (const auto& texts : groups) {
    torch::Tensor ids = PaddedTokenIds(tokenizer, texts).to(device());
    std::vector<torch::Tensor> result;
    if (outputs == 1) {
      ASSIGN_OR_RETURN(torch::Tensor hidden, encoder.Forward({ids}));
      result.push_back(std::move(hidden));
    } else {
      ASSIGN_OR_RETURN(result, encoder.ForwardTuple({ids}, outputs));
    }
    const torch::Tensor& hidden = result[0];
    if (hidden.dim() != 3 || hidden.size(0) != ids.size(0) || hidden.size(1) != ids.size(1)) {
      return Internal(StrCat(encoder.name(), " returned hidden states of shape ", hidden.sizes(),
                             ", expected [", ids.size(0), ", ", ids.size(1), ", hidden]"));
    }
    out.push_back(std::move(result));
  }
  residency().Done(encoder);
  return out;
}

StatusOr<std::vector<Conditioning>> SdPipeline::EncodeTexts(
    const std::vector<std::vector<std::string>>& groups, Component* next) {
  ASSIGN_OR_RETURN(auto hidden,
                   RunTextEncoder(component("text_encoder"), tokenizer_, groups, 1, next));
  std::vector<Conditioning> out;
  for (auto& h : hidden) out.push_back({std::move(h[0]), torch::Tensor()});
  return out;
}

std::vector<torch::Tensor> SdPipeline::RequestInputs(const GenerateParams& /*params*/) const {
  return {};
}

void SdPipeline::GenerateBatch(std::vector<BatchItem> items) {
  RunStages(std::move(items), &SdPipeline::EncodeBatch, &SdPipeline::DenoiseBatch);
}

Status SdPipeline::EncodeBatch(BatchRun& run) {
  // Note: with force_zeros_for_empty_prompt, a request without a negative prompt has zeros as
  // its negative conditioning, as diffusers does for negative_prompt=None; a negative prompt
  // that is given, "" included, is encoded.
  const bool zeros = manifest().conditioning.force_zeros_for_empty_prompt;
  std::vector<std::vector<std::string>> groups;
  for (const auto& r : run.requests) {
    const GenerateParams& p = *r.item.params;
    if (p.do_cfg() && !(zeros && !p.negative_prompt.has_value())) {
      groups.push_back({p.negative_prompt.value_or(""), p.prompt});
    } else {
      groups.push_back({p.prompt});
    }
  }
  ASSIGN_OR_RETURN(std::vector<Conditioning> encoded, EncodeTexts(groups, &component("unet")));
  for (size_t i = 0; i < run.requests.size(); ++i) {
    auto& r = run.requests[i];
    const GenerateParams& p = *r.item.params;
    const int64_t n = p.num_images;
    if (groups[i].size() == 2) {
      r.uncond = encoded[i].Rows(0, 1).Expand(n);
      r.cond = encoded[i].Rows(1, 2).Expand(n);
    } else {
      r.cond = encoded[i].Expand(n);
      if (p.do_cfg()) r.uncond = r.cond.Zeros();
    }
    for (const torch::Tensor& row : RequestInputs(p)) {
      r.inputs.push_back(ExpandRows(row.to(device()), n));
    }
  }
  run.MarkEncoded();
  return Status::Ok();
}

Status SdPipeline::DenoiseBatch(BatchRun& run) {
  const GenerateParams& first = run.first();
  ASSIGN_OR_RETURN(auto scheduler, MakeScheduler(first.scheduler, manifest().scheduler));
  RETURN_IF_ERROR(scheduler->SetTimesteps(first.steps));
  const auto& latent = manifest().latent;
  const int64_t h = first.height / latent.downscale;
  const int64_t w = first.width / latent.downscale;

  const c10::Device device = this->device();
  torch::Tensor latents =
      (run.Noise(latent.channels, h, w) * scheduler->init_noise_sigma()).to(device, dtype());
  if (scheduler->stochastic()) {
    // Drawn on the CPU (the image's generator); on a GPU copied from pinned memory without
    // waiting, so that the step does not wait for the denoiser's queued work.
    scheduler->set_noise_source([&run, &latent, h, w, device] {
      torch::Tensor noise = run.StepNoise(latent.channels, h, w);
      return device.is_cuda() ? noise.pin_memory().to(device, /*non_blocking=*/true) : noise;
    });
  }

  const bool cfg = first.do_cfg();
  std::vector<torch::Tensor> conditioning = run.DenoiserInputs(cfg);
  Component& unet = component("unet");
  RETURN_IF_ERROR(residency().Use(unet));
  residency().Prefetch(component("vae_decoder"));
  const auto& timesteps = scheduler->timesteps();
  const int total = static_cast<int>(timesteps.size());
  for (int i = 0; i < total; ++i) {
    const int before = run.running();
    latents =
        run.DropCancelled(latents, [&](const torch::Tensor& rows) { scheduler->KeepRows(rows); });
    if (run.running() == 0) return Status::Ok();
    if (run.running() != before) conditioning = run.DenoiserInputs(cfg);
    torch::Tensor model_in = cfg ? torch::cat({latents, latents}) : latents;
    model_in = scheduler->ScaleModelInput(model_in, i);
    torch::Tensor t =
        torch::full({model_in.size(0)}, timesteps[i], torch::dtype(torch::kFloat).device(device));
    std::vector<c10::IValue> inputs{model_in, t};
    inputs.insert(inputs.end(), conditioning.begin(), conditioning.end());
    ASSIGN_OR_RETURN(torch::Tensor eps, unet.Forward(std::move(inputs)));
    RETURN_IF_ERROR(CheckShape("unet", eps, model_in.sizes()));
    if (cfg) eps = run.Guide(eps);
    latents = scheduler->Step(eps, i, latents);
    run.Progress(i + 1, total);
  }
  residency().Done(unet);
  run.TakeLatents(latents, [](const torch::Tensor& rows) { return rows; });
  return Status::Ok();
}

StatusOr<EncodeOutput> SdPipeline::Encode(const std::vector<std::string>& prompts) {
  c10::InferenceMode inference;
  RequestResidencyScope scope(residency());
  try {
    EncodeOutput out;
    out.input_ids = PaddedTokenIds(tokenizer_, prompts);
    ASSIGN_OR_RETURN(std::vector<Conditioning> encoded, EncodeTexts({prompts}, /*next=*/nullptr));
    out.embeddings = encoded[0].context.to(torch::kCPU, torch::kFloat).contiguous();
    if (encoded[0].pooled.defined()) {
      out.pooled = encoded[0].pooled.to(torch::kCPU, torch::kFloat).contiguous();
    }
    return out;
  } catch (const std::exception& e) {
    return TorchErrorStatus(StrCat("pipeline '", manifest().name, "'"), e);
  }
}

}  // namespace qpool
