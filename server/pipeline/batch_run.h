// BatchRun: the requests of one Pipeline::GenerateBatch call and how each gets its result; the
// bookkeeping every kind's batch loop shares.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "pipeline/pipeline.h"
#include "pipeline/stage_timer.h"

namespace qpool {

// What BatchRun keeps of every request; a kind's Request type derives from it and adds the
// tensors its loop carries.
struct BatchRequest {
  BatchItem item;
  GenerateOutput output;
  bool running = true;
  torch::Tensor latents;                  // [n, channels, h, w] once the denoising loop is done
  std::vector<at::Generator> generators;  // one per image, from BatchRun::Noise
};

// Note [The last result waits for the residency]
// Each request's rows (num_images of them) follow the previous running request's in the
// latents. A request that ends (images decoded, cancelled, or the batch failed) gets its result
// at once, except the last one: it gets it only from FinishLast, which the kind calls once the
// pipeline is back in its policy's residency (Note [Offload policies]), so a client that saw its
// reply never sees the pipeline's memory in between.
//
// Thread safety: none; one worker thread runs a batch.
template <typename Request>
class BatchRun {
 public:
  // The batch begins now, on `device` (its first stage boundary: Note [Stage timings] in
  // pipeline/stage_timer.h).
  BatchRun(std::vector<BatchItem> items, c10::Device device) : timer_(device) {
    const int size = static_cast<int>(items.size());
    for (auto& item : items) {
      requests.emplace_back();
      requests.back().item = std::move(item);
      requests.back().output.batch_size = size;
    }
    begin_ = encoded_ = denoised_ = decoded_ = timer_.Mark();
  }

  const GenerateParams& first() const { return *requests.front().item.params; }
  int running() const {
    int n = 0;
    for (const auto& r : requests) n += r.running ? 1 : 0;
    return n;
  }
  // Ends the requests whose client cancelled; returns the rows of `latents` (dimension 0) of
  // those left, and hands their indices to `kept` (a multistep scheduler's KeepRows) when rows
  // were dropped.
  torch::Tensor DropCancelled(const torch::Tensor& latents,
                              const std::function<void(const torch::Tensor&)>& kept = nullptr) {
    std::vector<int64_t> keep;
    int64_t row = 0;
    bool dropped = false;
    for (auto& r : requests) {
      if (!r.running) continue;
      const int64_t n = r.item.params->num_images;
      if (r.item.cancelled && r.item.cancelled()) {
        End(r, Cancelled("request cancelled by the client"));
        dropped = true;
      } else {
        for (int64_t i = 0; i < n; ++i) keep.push_back(row + i);
      }
      row += n;
    }
    if (!dropped || keep.empty()) return latents;
    const torch::Tensor rows = torch::tensor(keep, torch::kLong).to(latents.device());
    if (kept) kept(rows);
    return latents.index_select(0, rows);
  }
  // Hands `r` its result, or keeps it for FinishLast when `r` is the last running request.
  void End(Request& r, StatusOr<GenerateOutput> result) {
    r.running = false;
    if (running() > 0) {
      r.item.done(std::move(result));
      return;
    }
    last_ = &r;
    last_result_ = std::move(result);
  }
  // Ends every running request with `status`.
  void Fail(const Status& status) {
    for (auto& r : requests) {
      if (r.running) End(r, status);
    }
  }
  // Hands the last request its result; call once the residency is restored.
  void FinishLast() {
    if (last_ != nullptr) last_->item.done(std::move(*last_result_));
  }
  // Noise from a CPU generator per image (seed + i for image i of a request), float32 [images,
  // channels, h, w] on the CPU: identical bytes for a seed on every run, batched or not. Starts
  // the generators StepNoise continues.
  torch::Tensor Noise(int64_t channels, int64_t h, int64_t w) {
    std::vector<torch::Tensor> noise;
    for (auto& r : requests) {
      const GenerateParams& p = *r.item.params;
      r.generators.clear();
      for (int64_t i = 0; i < p.num_images; ++i) {
        r.generators.push_back(
            at::make_generator<at::CPUGeneratorImpl>(p.seed + static_cast<uint64_t>(i)));
        noise.push_back(torch::randn({1, channels, h, w}, r.generators.back(), torch::kFloat));
      }
    }
    return torch::cat(noise);
  }
  // The next noise of each running request's images from the generators Noise started, in the
  // rows of the loop's latents (an ancestral sampler's per-step noise), float32 on the CPU.
  torch::Tensor StepNoise(int64_t channels, int64_t h, int64_t w) {
    std::vector<torch::Tensor> noise;
    for (auto& r : requests) {
      if (!r.running) continue;
      TORCH_CHECK(!r.generators.empty(), "StepNoise before Noise");
      for (at::Generator& gen : r.generators) {
        noise.push_back(torch::randn({1, channels, h, w}, gen, torch::kFloat));
      }
    }
    return torch::cat(noise);
  }
  // The text encoders' work for every request is queued: the end of the encode stage.
  void MarkEncoded() { encoded_ = timer_.Mark(); }
  // Gives each running request its rows of the loop's final `latents` (through `unpack`, which
  // maps rows to [n, channels, h, w]); the end of the denoise stage.
  template <typename Unpack>
  void TakeLatents(const torch::Tensor& latents, Unpack unpack) {
    int64_t row = 0;
    for (auto& r : requests) {
      if (!r.running) continue;
      const int64_t n = r.item.params->num_images;
      r.latents = unpack(latents.slice(0, row, row + n));
      row += n;
    }
    denoised_ = decoded_ = timer_.Mark();
  }
  // r's pixels are on the host: the end of its decode stage, and its stage timings.
  void MarkDecoded(Request& r) {
    const size_t now = timer_.Mark();
    r.output.timings.encode_seconds = timer_.Seconds(begin_, encoded_);
    r.output.timings.denoise_seconds = timer_.Seconds(encoded_, denoised_);
    r.output.timings.decode_seconds = timer_.Seconds(decoded_, now);
    decoded_ = now;
  }
  // Classifier-free guidance of a prediction for [negative rows of every running request,
  // positive rows of every running request], each request with its own scale (cfg_scale), on
  // its own rows.
  torch::Tensor Guide(const torch::Tensor& prediction) const {
    auto chunks = prediction.chunk(2);
    std::vector<torch::Tensor> parts;
    int64_t row = 0;
    for (const auto& r : requests) {
      if (!r.running) continue;
      const int64_t n = r.item.params->num_images;
      torch::Tensor u = chunks[0].slice(0, row, row + n);
      torch::Tensor c = chunks[1].slice(0, row, row + n);
      parts.push_back(u + (c - u) * r.item.params->cfg_scale());
      row += n;
    }
    return parts.size() == 1 ? parts[0] : torch::cat(parts);
  }
  // Reports step `step` of `total` to every running request.
  void Progress(int step, int total) {
    for (auto& r : requests) {
      if (r.running && r.item.progress) r.item.progress(step, total);
    }
  }

  std::vector<Request> requests;

 private:
  Request* last_ = nullptr;
  std::optional<StatusOr<GenerateOutput>> last_result_;
  StageTimer timer_;
  size_t begin_ = 0, encoded_ = 0, denoised_ = 0, decoded_ = 0;  // boundaries of timer_
};

// Runs `stages` (Status()) on `run` for `pipeline` under inference mode and the pipeline's
// request residency scope; a failure or exception ends every running request with it, and the
// last request gets its result once the scope has restored the residency.
template <typename Run, typename Stages>
void RunBatch(Pipeline& pipeline, Run& run, Stages stages) {
  {
    c10::InferenceMode inference;
    RequestResidencyScope scope(pipeline.residency());
    Status status;
    try {
      status = stages();
    } catch (const std::exception& e) {
      status = TorchErrorStatus(StrCat("pipeline '", pipeline.manifest().name, "'"), e);
    }
    if (!status.ok()) run.Fail(status);
  }
  run.FinishLast();
}

template <typename Run, typename Kind>
void Pipeline::RunStages(std::vector<BatchItem> items, Status (Kind::*encode)(Run&),
                         Status (Kind::*denoise)(Run&)) {
  if (items.empty()) return;
  Kind& kind = static_cast<Kind&>(*this);
  Run run(std::move(items), device());
  RunBatch(*this, run, [&] {
    Status status = (kind.*encode)(run);
    if (status.ok()) status = (kind.*denoise)(run);
    if (status.ok()) status = DecodeRunning(run);
    return status;
  });
}

template <typename Run>
Status Pipeline::DecodeRunning(Run& run) {
  if (run.running() == 0) return Status::Ok();  // all cancelled: the decoder stays where it is
  Component& decoder = component("vae_decoder");
  RETURN_IF_ERROR(residency().Use(decoder));
  for (auto& r : run.requests) {
    if (!r.running) continue;
    ASSIGN_OR_RETURN(torch::Tensor pixels, DecodePixels(decoder, r.latents));
    run.MarkDecoded(r);
    const auto start = std::chrono::steady_clock::now();
    r.output.images = EncodePngs(pixels);
    r.output.timings.png_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.latents = torch::Tensor();
    run.End(r, std::move(r.output));
  }
  residency().Done(decoder);
  return Status::Ok();
}

}  // namespace qpool
