// Pipeline: one loaded pipeline of any kind on one device: its manifest, its components (which
// qpool owns) and their residency. Each kind (pipeline/<kind>/) implements the run.
#pragma once

#include <torch/script.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "component/component.h"
#include "config/manifest.h"
#include "pipeline/generate_request.h"
#include "pipeline/load_stages.h"
#include "residency/pipeline_residency.h"
#include "util/file_identity.h"
#include "util/status.h"

namespace qpool {

class PipelineKind;

struct GeneratedImage {
  std::string png;
  int width = 0;
  int height = 0;
};

struct StageTimings {
  double encode_seconds = 0;
  double denoise_seconds = 0;
  double decode_seconds = 0;
  double png_seconds = 0;  // on the host, after decode
};

struct GenerateOutput {
  std::vector<GeneratedImage> images;
  StageTimings timings;
  // Requests whose denoising loop ran together with this one's, itself included.
  int batch_size = 1;
};

struct EncodeOutput {
  torch::Tensor embeddings;  // float32, CPU, [n, max_length, hidden]
  torch::Tensor input_ids;   // int64, CPU, [n, max_length] (of the first tokenizer)
  torch::Tensor pooled;  // float32, CPU, [n, dim] for kinds with pooled embeddings; else undefined
  // Kinds with an LLM text encoder: float32 [layers, n, length, hidden] and int64 [n, length]
  // on the CPU; else undefined.
  torch::Tensor llm_embeddings;
  torch::Tensor llm_input_ids;
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

// Thread safety: GenerateBatch and Encode may not run concurrently on one pipeline; the device
// worker that owns it runs one request at a time. device(), the accessors and the residency's
// snapshots may be read from any thread.
class Pipeline {
 public:
  // Drops every tensor of every component.
  virtual ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Runs requests that are BatchCompatible with the first one as one batch (the denoiser once
  // per step for all of them). Every item's done is called exactly once, and the pipeline is back
  // in its policy's residency (Note [Offload policies]) before the last one is. A batch of one is
  // a single request. Noise is drawn on the CPU from seed + i for image i, so a seed gives
  // identical images on the same device.
  virtual void GenerateBatch(std::vector<BatchItem> items) = 0;
  // Runs the text encoder(s) alone; under the model policy they go back to the host afterwards,
  // like after every request.
  virtual StatusOr<EncodeOutput> Encode(const std::vector<std::string>& prompts) = 0;

  // A single request: GenerateBatch of one.
  StatusOr<GenerateOutput> Generate(const GenerateParams& params, const ProgressFn& progress,
                                    const CancelledFn& cancelled);

  const PipelineKind& kind() const { return kind_; }
  const PipelineManifest& manifest() const { return manifest_; }
  // The device the pipeline computes on (its components may be offloaded to the host).
  c10::Device device() const { return residency_->device(); }
  c10::ScalarType dtype() const { return dtype_; }
  // In the kind's component order.
  const std::vector<std::unique_ptr<Component>>& components() const { return components_; }
  PipelineResidency& residency() { return *residency_; }
  const PipelineResidency& residency() const { return *residency_; }
  // Where LoadComponents' time went (warmup_seconds is the registry's to add).
  const LoadStages& load_stages() const { return load_stages_; }
  // The files the components were read from (graphs and weights files) whose identity on disk
  // is no longer what it was when they were read: a re-import over the loaded pipeline serves
  // the old tensors until the pipeline is loaded again. Stats each file; any thread.
  std::vector<std::string> FilesChangedSinceLoad() const;

 protected:
  Pipeline(const PipelineKind& kind, PipelineManifest manifest, c10::ScalarType dtype);

  // Loads the kind's components from the manifest's files onto the CPU, in the kind's order,
  // quantizes those whose manifest entry asks for it at load time, and places them all on
  // `device` as the manifest's offload policy wants (host copies in dtype()). All or nothing: on
  // failure the caller drops the pipeline, and with it every block. Errors name the manifest.
  Status LoadComponents(const c10::Device& device, const ResidencyContext& residency);
  // The component called `name`; the kind declared it, so LoadComponents loaded it.
  Component& component(const std::string& name);
  // Lets `name` (the denoiser, whose forward runs at every step) replay CUDA graphs of its
  // forward when it runs on a GPU, unless the manifest's execution.cuda_graphs is off
  // (Note [Forward graphs] in component/graph_cache.h).
  void UseForwardGraphs(const std::string& name);
  // Lets text encoder `encoder` replay CUDA graphs of its forward while the offload policy keeps
  // it on the device between requests (none, idle), unless execution.cuda_graphs is off. Under
  // model it runs eagerly: it moves at every request, which would drop its graphs each time, so
  // a request would capture a graph for the one or two forwards it makes. Called before each
  // encoding, so a policy change takes effect at the next request.
  void UseEncoderGraphs(Component& encoder);
  // The images of latents [n, latent.channels, h, w] (in latent space, before the manifest's
  // scaling and shift) as 8-bit RGB pixels on the host, [n, height, width, 3]: `decoder`
  // (resident) gets latents / scaling_factor + shift_factor.
  StatusOr<torch::Tensor> DecodePixels(Component& decoder, const torch::Tensor& latents);
  // One PNG per image of DecodePixels' `pixels`.
  static std::vector<GeneratedImage> EncodePngs(const torch::Tensor& pixels);
  // Decodes the latents of each running request of `run` (a BatchRun: pipeline/batch_run.h,
  // which defines it) with vae_decoder and hands the request its images.
  template <typename Run>
  Status DecodeRunning(Run& run);
  // GenerateBatch of a kind whose stages are `encode` and `denoise` (members of Kind, the
  // calling pipeline, each Status(Run&)), then DecodeRunning: the batch's Run made of `items`,
  // under RunBatch (pipeline/batch_run.h, which defines it).
  template <typename Run, typename Kind>
  void RunStages(std::vector<BatchItem> items, Status (Kind::*encode)(Run&),
                 Status (Kind::*denoise)(Run&));

 private:
  const PipelineKind& kind_;
  const PipelineManifest manifest_;
  const c10::ScalarType dtype_;
  std::vector<std::unique_ptr<Component>> components_;
  std::unique_ptr<PipelineResidency> residency_;  // borrows components_
  LoadStages load_stages_;
  // Each file LoadComponents read, with its identity as it was read (fixed once loaded).
  std::vector<std::pair<std::string, FileIdentity>> loaded_files_;
};

// Parses "float32"/"float16"/"bfloat16"; "auto" is float16 on CUDA, float32 on the CPU.
StatusOr<c10::ScalarType> ResolveDtype(const std::string& name, const c10::Device& device);

// Each text of `texts` padded to `tokenizer`'s max_length (its EncodePadded), int64 [texts,
// max_length] on the CPU; any tokenizer with max_length() and EncodePadded(text).
template <typename Tokenizer>
torch::Tensor PaddedTokenIds(const Tokenizer& tokenizer, const std::vector<std::string>& texts) {
  const int64_t length = tokenizer.max_length();
  auto ids = torch::empty({static_cast<int64_t>(texts.size()), length}, torch::kLong);
  auto* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int64_t> row = tokenizer.EncodePadded(texts[i]);
    std::copy(row.begin(), row.end(), out + i * length);
  }
  return ids;
}

// PaddedTokenIds with the attention mask of each row (1 for every id that is not padding), both
// int64 [texts, max_length] on the CPU; any tokenizer with max_length() and
// EncodePadded(text, &mask).
template <typename Tokenizer>
std::pair<torch::Tensor, torch::Tensor> PaddedTokensAndMask(const Tokenizer& tokenizer,
                                                            const std::vector<std::string>& texts) {
  const int64_t length = tokenizer.max_length();
  const int64_t n = static_cast<int64_t>(texts.size());
  auto ids = torch::empty({n, length}, torch::kLong);
  auto mask = torch::empty({n, length}, torch::kLong);
  std::vector<int64_t> row_mask;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> row = tokenizer.EncodePadded(texts[i], &row_mask);
    std::copy(row.begin(), row.end(), ids.data_ptr<int64_t>() + i * length);
    std::copy(row_mask.begin(), row_mask.end(), mask.data_ptr<int64_t>() + i * length);
  }
  return {ids, mask};
}

// The status of a component that returned `t` where `expected` was due: Internal, naming the
// component and the contract of its kind (docs/model-repository.md).
Status CheckShape(const std::string& what, const torch::Tensor& t, c10::IntArrayRef expected);

}  // namespace qpool
