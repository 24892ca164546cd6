#include "pipeline/sd_pipeline.h"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>

#include "pipeline/scheduler/scheduler.h"
#include "quant/module_quantizer.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/png_encoder.h"

namespace qpool {
namespace {

using Clock = std::chrono::steady_clock;

const char* const kComponentNames[] = {"text_encoder", "unet", "vae_decoder"};

Status CheckShape(const char* what, const torch::Tensor& t, c10::IntArrayRef expected) {
  if (t.sizes() != expected) {
    return Internal(StrCat(what, " returned shape ", t.sizes(), ", expected ", expected,
                           "; the component does not follow the sd contract "
                           "(docs/model-repository.md)"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<c10::ScalarType> ResolveDtype(const std::string& name, const c10::Device& device) {
  if (name == "auto") return device.is_cuda() ? c10::kHalf : c10::kFloat;
  if (name == "float32") return c10::kFloat;
  if (name == "float16") return c10::kHalf;
  if (name == "bfloat16") return c10::kBFloat16;
  return InvalidArgument(
      StrCat("unknown dtype '", name, "'; valid: auto, float32, float16, bfloat16"));
}

SdPipeline::SdPipeline(PipelineManifest manifest, ClipTokenizer tokenizer, c10::ScalarType dtype)
    : manifest_(std::move(manifest)), tokenizer_(std::move(tokenizer)), dtype_(dtype) {}

SdPipeline::~SdPipeline() {
  if (residency_) residency_->Unload();
}

StatusOr<std::unique_ptr<SdPipeline>> SdPipeline::Load(const PipelineManifest& manifest,
                                                       const c10::Device& device,
                                                       c10::ScalarType dtype,
                                                       const ResidencyContext& residency) {
  if (manifest.kind != "sd") {
    return InvalidArgument(StrCat(manifest.path, ": kind '", manifest.kind,
                                  "' is not served by the sd pipeline"));
  }
  ASSIGN_OR_RETURN(ClipTokenizer tokenizer,
                   ClipTokenizer::Load(manifest.tokenizer.vocab, manifest.tokenizer.merges,
                                       manifest.tokenizer.max_length));
  std::unique_ptr<SdPipeline> pipeline(
      new SdPipeline(manifest, std::move(tokenizer), dtype));
  ASSIGN_OR_RETURN(OffloadPolicy policy,
                   MakeOffloadPolicy(manifest.offload.policy, manifest.offload.idle_seconds));
  for (const char* name : kComponentNames) {
    const ComponentSpec* spec = manifest.FindComponent(name);
    if (spec == nullptr) {
      return InvalidArgument(StrCat(manifest.path, ": field 'components.", name, "' is required"));
    }
    ASSIGN_OR_RETURN(auto component, Component::Load(name, spec->file));
    const QuantizationSpec& q = spec->quantization;
    if (q.format != "none" && component->quantization() == "none") {
      quant::QuantSettings settings;
      settings.format = q.format;
      settings.blocksize = q.blocksize;
      settings.double_quant = q.double_quant;
      settings.skip = q.skip;
      auto report = quant::QuantizeModule(component->module(), settings);
      if (!report.ok()) {
        return Status(report.status().code(),
                      StrCat(manifest.path, ": components.", name, ".quantization: ",
                             report.status().message()));
      }
      component->Refresh();
      log::Info("pipeline '", manifest.name, "': quantized ", name, " to ", q.format,
                " at load time");
    }
    pipeline->components_.push_back(std::move(component));
  }
  std::vector<Component*> components;
  for (auto& c : pipeline->components_) components.push_back(c.get());
  pipeline->residency_ =
      std::make_unique<PipelineResidency>(manifest.name, components, residency, policy);
  // All or nothing: on failure the caller drops the pipeline and with it every block.
  Status placed = pipeline->residency_->Place(device, dtype);
  if (!placed.ok()) {
    return Status(placed.code(), StrCat(manifest.path, ": ", placed.message()));
  }
  return pipeline;
}

Component& SdPipeline::component(const std::string& name) {
  for (auto& c : components_) {
    if (c->name() == name) return *c;
  }
  throw std::logic_error("sd pipeline without component " + name);  // Load guarantees all three
}

torch::Tensor SdPipeline::TokenIds(const std::vector<std::string>& texts) const {
  const int64_t length = tokenizer_.max_length();
  auto ids = torch::empty({static_cast<int64_t>(texts.size()), length}, torch::kLong);
  auto* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int64_t> row = tokenizer_.EncodePadded(texts[i]);
    std::copy(row.begin(), row.end(), out + i * length);
  }
  return ids;
}

StatusOr<torch::Tensor> SdPipeline::EncodeTexts(const std::vector<std::string>& texts,
                                                Component* next) {
  Component& encoder = component("text_encoder");
  RETURN_IF_ERROR(residency_->Use(encoder));
  // Queued on the copy stream after the encoder's own copy, so it overlaps the encoding instead
  // of delaying it.
  if (next != nullptr) residency_->Prefetch(*next);
  torch::Tensor ids = TokenIds(texts).to(device());
  ASSIGN_OR_RETURN(torch::Tensor hidden, encoder.Forward({ids}));
  residency_->Done(encoder);
  if (hidden.dim() != 3 || hidden.size(0) != ids.size(0) || hidden.size(1) != ids.size(1)) {
    return Internal(StrCat("text_encoder returned shape ", hidden.sizes(),
                           ", expected [", ids.size(0), ", ", ids.size(1), ", hidden]"));
  }
  return hidden;
}

StatusOr<GenerateOutput> SdPipeline::Generate(const GenerateParams& params,
                                              const ProgressFn& progress,
                                              const CancelledFn& cancelled) {
  c10::InferenceMode inference;
  RequestResidencyScope residency(*residency_);
  GenerateOutput output;
  try {
    auto start = Clock::now();
    const bool cfg = params.do_cfg();
    std::vector<std::string> texts = {params.prompt};
    if (cfg) texts.insert(texts.begin(), params.negative_prompt);
    ASSIGN_OR_RETURN(torch::Tensor hidden, EncodeTexts(texts, &component("unet")));
    // Context rows: [uncond x n, cond x n] with CFG, [cond x n] without.
    const int64_t n = params.num_images;
    torch::Tensor context;
    if (cfg) {
      context = torch::cat({hidden.slice(0, 0, 1).expand({n, -1, -1}),
                            hidden.slice(0, 1, 2).expand({n, -1, -1})});
    } else {
      context = hidden.expand({n, -1, -1});
    }
    context = context.contiguous();
    output.timings.encode_seconds = SecondsSince(start);

    start = Clock::now();
    ASSIGN_OR_RETURN(torch::Tensor latents, Denoise(params, context, progress, cancelled));
    output.timings.denoise_seconds = SecondsSince(start);

    start = Clock::now();
    ASSIGN_OR_RETURN(output.images, Decode(latents));
    output.timings.decode_seconds = SecondsSince(start);
  } catch (const std::exception& e) {
    return TorchErrorStatus(StrCat("pipeline '", manifest_.name, "'"), e);
  }
  return output;
}

StatusOr<torch::Tensor> SdPipeline::Denoise(const GenerateParams& params,
                                            const torch::Tensor& context,
                                            const ProgressFn& progress,
                                            const CancelledFn& cancelled) {
  ASSIGN_OR_RETURN(auto scheduler, MakeScheduler(params.scheduler, manifest_.scheduler));
  RETURN_IF_ERROR(scheduler->SetTimesteps(params.steps));
  const auto& latent = manifest_.latent;
  const int64_t n = params.num_images;
  const int64_t h = params.height / latent.downscale;
  const int64_t w = params.width / latent.downscale;

  // Noise from a CPU generator per image: identical bytes for a seed on every run.
  std::vector<torch::Tensor> noise;
  for (int64_t i = 0; i < n; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(params.seed + static_cast<uint64_t>(i));
    noise.push_back(torch::randn({1, latent.channels, h, w}, gen, torch::kFloat));
  }
  const c10::Device device = this->device();
  torch::Tensor latents =
      (torch::cat(noise) * scheduler->init_noise_sigma()).to(device, dtype_);

  const bool cfg = params.do_cfg();
  Component& unet = component("unet");
  RETURN_IF_ERROR(residency_->Use(unet));
  residency_->Prefetch(component("vae_decoder"));
  const auto& timesteps = scheduler->timesteps();
  const int total = static_cast<int>(timesteps.size());
  for (int i = 0; i < total; ++i) {
    if (cancelled && cancelled()) return Cancelled("request cancelled by the client");
    torch::Tensor model_in = cfg ? torch::cat({latents, latents}) : latents;
    model_in = scheduler->ScaleModelInput(model_in, i);
    torch::Tensor t =
        torch::full({model_in.size(0)}, timesteps[i], torch::dtype(dtype_).device(device));
    ASSIGN_OR_RETURN(torch::Tensor eps, unet.Forward({model_in, t, context}));
    RETURN_IF_ERROR(CheckShape("unet", eps, model_in.sizes()));
    if (cfg) {
      auto chunks = eps.chunk(2);
      eps = chunks[0] + (chunks[1] - chunks[0]) * params.guidance_scale;
    }
    latents = scheduler->Step(eps, i, latents);
    if (progress) progress(i + 1, total);
  }
  residency_->Done(unet);
  return latents;
}

StatusOr<std::vector<GeneratedImage>> SdPipeline::Decode(const torch::Tensor& latents) {
  const auto& latent = manifest_.latent;
  Component& decoder = component("vae_decoder");
  RETURN_IF_ERROR(residency_->Use(decoder));
  ASSIGN_OR_RETURN(torch::Tensor image, decoder.Forward({latents / latent.scaling_factor}));
  residency_->Done(decoder);
  const int64_t n = latents.size(0);
  const int64_t height = latents.size(2) * latent.downscale;
  const int64_t width = latents.size(3) * latent.downscale;
  RETURN_IF_ERROR(CheckShape("vae_decoder", image, {n, 3, height, width}));
  torch::Tensor pixels = ((image.to(torch::kFloat) / 2 + 0.5).clamp(0, 1) * 255)
                             .round()
                             .to(torch::kUInt8)
                             .permute({0, 2, 3, 1})
                             .contiguous()
                             .cpu();
  std::vector<GeneratedImage> images;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* data = pixels[i].data_ptr<uint8_t>();
    images.push_back({EncodePng(data, static_cast<int>(width), static_cast<int>(height)),
                      static_cast<int>(width), static_cast<int>(height)});
  }
  return images;
}

StatusOr<EncodeOutput> SdPipeline::Encode(const std::vector<std::string>& prompts) {
  c10::InferenceMode inference;
  RequestResidencyScope residency(*residency_);
  try {
    EncodeOutput out;
    out.input_ids = TokenIds(prompts);
    ASSIGN_OR_RETURN(torch::Tensor hidden, EncodeTexts(prompts, /*next=*/nullptr));
    out.embeddings = hidden.to(torch::kCPU, torch::kFloat).contiguous();
    return out;
  } catch (const std::exception& e) {
    return TorchErrorStatus(StrCat("pipeline '", manifest_.name, "'"), e);
  }
}

}  // namespace qpool
