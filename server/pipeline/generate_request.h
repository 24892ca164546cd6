// Native, validated form of a Generate request (no protobuf, no torch).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/manifest.h"
#include "util/status.h"

namespace qpool {

// A request as the client sent it: an absent field (or empty scheduler) takes the default.
struct GenerateRequestIn {
  std::string pipeline;
  std::string prompt;
  std::optional<std::string> negative_prompt;  // absent: none given ("" is a given prompt)
  std::optional<uint32_t> steps;
  std::optional<float> guidance_scale;
  std::optional<uint32_t> width;
  std::optional<uint32_t> height;
  std::optional<uint32_t> num_images;
  std::optional<uint64_t> seed;
  std::string scheduler;
  // Size conditioning (SizeConditioning); only kinds that take it accept them.
  std::optional<uint32_t> original_width;
  std::optional<uint32_t> original_height;
  std::optional<uint32_t> target_width;
  std::optional<uint32_t> target_height;
  std::optional<uint32_t> crop_top;
  std::optional<uint32_t> crop_left;
  std::optional<float> true_cfg_scale;  // kinds with embedded guidance only
};

// What an SDXL-style denoiser is told about the image's size (diffusers' original_size,
// crops_coords_top_left and target_size, the "micro-conditioning" its training saw): by default
// original and target are the image's size and the crop is (0, 0). The negative half of a CFG
// batch gets the same values.
struct SizeConditioning {
  int original_width = 0;
  int original_height = 0;
  int crop_top = 0;
  int crop_left = 0;
  int target_width = 0;
  int target_height = 0;
};

// The largest size or crop offset a request may condition on.
inline constexpr int kMaxConditioningSize = 16384;

// Every field resolved against the pipeline's defaults and checked against its limits.
struct GenerateParams {
  std::string prompt;
  // Absent is diffusers' negative_prompt=None: an empty prompt for CFG, zeros for kinds that
  // force them for empty prompts, no true CFG with embedded guidance. "" is a given prompt.
  std::optional<std::string> negative_prompt;
  int steps = 0;
  double guidance_scale = 0;
  int width = 0;
  int height = 0;
  int num_images = 1;
  uint64_t seed = 0;  // image i uses seed + i
  std::string scheduler;
  SizeConditioning size;  // resolved whether or not the kind reads it
  // guidance_scale is an input of the denoiser (FLUX's distilled guidance embedding) rather than
  // the scale of classifier-free guidance.
  bool embedded_guidance = false;
  // With embedded guidance, the scale of classifier-free guidance on top of it (1: off).
  double true_cfg_scale = 1.0;
  // Classifier-free guidance runs the denoiser on both prompts: guidance_scale > 1, or with
  // embedded guidance true_cfg_scale > 1 and a negative prompt (possibly "").
  bool do_cfg() const {
    return embedded_guidance ? true_cfg_scale > 1.0 && negative_prompt.has_value()
                             : guidance_scale > 1.0;
  }
  // The scale classifier-free guidance combines the two predictions with.
  double cfg_scale() const { return embedded_guidance ? true_cfg_scale : guidance_scale; }
};

// What a kind reads of a request beyond the fields every kind reads.
struct RequestFeatures {
  bool size_conditioning = false;  // the SizeConditioning fields (sdxl)
  bool embedded_guidance = false;  // GenerateParams::embedded_guidance, true_cfg_scale (flux)
  ScheduleFamily schedule = ScheduleFamily::kDdpm;  // the samplers it runs (SamplerNames)
  int size_multiple = 8;  // width and height are multiples of this and of latent.downscale
};

// Whether two requests can share a denoising loop (Note [Dynamic batching] in
// pool/batch_queue.h): same size, steps and scheduler, and classifier-free guidance on for both
// or off for both. Prompts, seeds, image counts and guidance scales may differ.
bool BatchCompatible(const GenerateParams& a, const GenerateParams& b);

// Fills defaults from the manifest, draws a random seed when none is given, and returns
// InvalidArgument naming the field for anything out of range. The size-conditioning fields are
// InvalidArgument unless the kind reads them (`features`).
StatusOr<GenerateParams> ResolveGenerateRequest(const GenerateRequestIn& in,
                                                const PipelineManifest& manifest,
                                                const RequestFeatures& features = {});

// Prompt bytes beyond this are refused, for every RPC that takes prompts: the tokenizer keeps
// max_length - 2 tokens anyway, and a huge prompt would hold its device worker while it is
// tokenized.
inline constexpr size_t kMaxPromptBytes = 16 * 1024;

// Checks an Encode request's prompts against the manifest's limits (count) and kMaxPromptBytes.
Status ValidateEncodePrompts(const std::vector<std::string>& prompts,
                             const PipelineManifest& manifest);

}  // namespace qpool
