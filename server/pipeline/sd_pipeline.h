// SdPipeline: a Stable-Diffusion-1.x-shaped text-to-image pipeline (kind "sd"): CLIP tokenizer,
// text encoder, UNet denoiser with classifier-free guidance, DDIM/Euler schedulers, VAE decoder.
#pragma once

#include <torch/script.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/manifest.h"
#include "pipeline/component.h"
#include "pipeline/generate_request.h"
#include "pipeline/tokenizer/clip_tokenizer.h"
#include "residency/pipeline_residency.h"
#include "util/status.h"

namespace qpool {

struct GeneratedImage {
  std::string png;
  int width = 0;
  int height = 0;
};

struct StageTimings {
  double encode_seconds = 0;
  double denoise_seconds = 0;
  double decode_seconds = 0;
};

struct GenerateOutput {
  std::vector<GeneratedImage> images;
  StageTimings timings;
  int batch_size =
      1;  // requests whose denoising loop ran together with this one's, itself included
};

struct EncodeOutput {
  torch::Tensor embeddings;  // float32, CPU, [n, max_length, hidden]
  torch::Tensor input_ids;   // int64, CPU, [n, max_length]
};

// Called after each denoising step with (1-based step, total).
using ProgressFn = std::function<void(int step, int total)>;
// Polled between steps; returning true stops the request with CANCELLED.
using CancelledFn = std::function<bool()>;

// One request of a batch (Note [Dynamic batching] in pool/batch_queue.h).
struct BatchItem {
  const GenerateParams* params = nullptr;  // must outlive the GenerateBatch call
  ProgressFn progress;                     // may be empty
  CancelledFn cancelled;                   // may be empty
  // Called exactly once, on the calling thread, as soon as the request's part ends: its images,
  // or why it stopped (Cancelled at a step, or the batch's failure). Nothing of the item is used
  // after it.
  std::function<void(StatusOr<GenerateOutput>)> done;
};

// Thread safety: Generate and Encode may not run concurrently on one pipeline; the device
// worker that owns it runs one request at a time.
class SdPipeline {
 public:
  // Loads tokenizer and components on the CPU, quantizes components whose manifest asks for it
  // at load time, packs them into host copies in `dtype` and brings them to the residency the
  // manifest's offload policy wants on `device`. All or nothing.
  static StatusOr<std::unique_ptr<SdPipeline>> Load(const PipelineManifest& manifest,
                                                    const c10::Device& device,
                                                    c10::ScalarType dtype,
                                                    const ResidencyContext& residency);
  // Drops every tensor of every component.
  ~SdPipeline();

  // Runs a validated request. Noise is drawn on the CPU from seed + i for image i, so a seed
  // gives identical images on the same device.
  StatusOr<GenerateOutput> Generate(const GenerateParams& params, const ProgressFn& progress,
                                    const CancelledFn& cancelled);
  // Runs requests that are BatchCompatible with the first one as one batch: the denoising loop
  // runs the UNet once per step for all of them, while each request's prompts are encoded, its
  // noise drawn and its images decoded on their own. A request cancelled at a step leaves the
  // batch there; a failure ends every request still running. A batch of one is Generate.
  void GenerateBatch(std::vector<BatchItem> items);

  // Runs the text encoder alone. Under the model policy the encoder goes back to the host
  // afterwards like after every request (Note [Offload policies]).
  StatusOr<EncodeOutput> Encode(const std::vector<std::string>& prompts);

  const PipelineManifest& manifest() const { return manifest_; }
  // The device the pipeline computes on (its components may be offloaded to the host).
  c10::Device device() const { return residency_->device(); }
  c10::ScalarType dtype() const { return dtype_; }
  const std::vector<std::unique_ptr<Component>>& components() const { return components_; }
  PipelineResidency& residency() { return *residency_; }
  const PipelineResidency& residency() const { return *residency_; }

 private:
  SdPipeline(PipelineManifest manifest, ClipTokenizer tokenizer, c10::ScalarType dtype);
  Component& component(const std::string& name);
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

  PipelineManifest manifest_;
  ClipTokenizer tokenizer_;
  c10::ScalarType dtype_;
  std::vector<std::unique_ptr<Component>> components_;
  std::unique_ptr<PipelineResidency> residency_;  // borrows components_
};

// Parses "float32"/"float16"/"bfloat16"; "auto" is float16 on CUDA, float32 on the CPU.
StatusOr<c10::ScalarType> ResolveDtype(const std::string& name, const c10::Device& device);

}  // namespace qpool
