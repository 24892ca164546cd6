// PipelineKind: what one kind of pipeline (the manifest's `kind:`) declares and how it loads.
// Each kind lives in pipeline/<kind>/; pool/ and api/ see kinds only through this interface.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/manifest.h"
#include "pipeline/generate_request.h"
#include "util/status.h"

namespace qpool {

class Pipeline;
struct ResidencyContext;

// What a component does in a run, in the order the stages run them.
enum class ComponentRole { kTextEncoder, kDenoiser, kDecoder };

// One component a kind requires: the manifest's components.<name>, and the signature of its
// forward (Note [Component signatures] in pipeline.cpp).
struct ComponentDecl {
  std::string name;
  ComponentRole role;
  std::vector<std::string> inputs;  // forward's arguments after self, by name
  size_t outputs = 1;               // 1: a tensor; more: a tuple of that many
  // Its 4-d weights are laid out channels-last on GPUs (Note [Channels-last convolutions] in
  // component/component.h)...
  bool channels_last = false;
  // ... when its graph calls this operator (empty: always).
  std::string channels_last_needs = "";
};

// The image decoder the kinds here end with: vae_decoder(latents) -> image, its weights
// channels-last on GPUs where its norms keep that layout (Note [Channels-last convolutions]).
ComponentDecl VaeDecoderDecl();

// Note [Pipeline kinds]
// A kind declares its components (names and roles, in the order its stages run them: encode
// prompts, denoise, decode), checks requests against a manifest's limits, estimates the working
// memory of a request before any has been measured, and loads a Pipeline whose GenerateBatch and
// Encode run its stages. Everything else is the same for every kind and lives outside it: the
// manifest's common sections (config/), the tensors and their residency (component/,
// residency/), routing, admission and requests (pool/), the gRPC edge (api/). Kinds are
// registered in one place (pipeline_kinds.cpp); adding one touches pipeline/<kind>/, that
// registry, the exporter and the tests.
//
// Thread safety: kinds are immutable; every method may be called from any thread.
class PipelineKind {
 public:
  virtual ~PipelineKind() = default;

  // The manifest's `kind:` value.
  virtual const std::string& name() const = 0;
  // The components its manifests must list, in run order.
  virtual const std::vector<ComponentDecl>& components() const = 0;
  // The kind-specific manifest sections it reads (KindManifestSpec::sections); none by default.
  virtual const std::vector<std::string>& manifest_sections() const;
  // Its noise schedule and the formats of its tokenizer_N sections (KindManifestSpec); DDPM and
  // CLIP BPE by default.
  virtual ScheduleFamily schedule() const { return ScheduleFamily::kDdpm; }
  virtual std::map<std::string, TokenizerFormat> tokenizer_formats() const { return {}; }
  // Fills a Generate request's defaults from the manifest and checks it against its limits:
  // InvalidArgument naming the field for anything out of range.
  virtual StatusOr<GenerateParams> ResolveGenerate(const GenerateRequestIn& in,
                                                   const PipelineManifest& manifest) const;
  // Whether a Generate request of the manifest's defaults alone is valid for this kind (the
  // manifest parser checks the defaults against the manifest only; a kind may ask more, such as
  // sizes that are multiples of its patch): InvalidArgument naming the field otherwise.
  Status CheckDefaults(const PipelineManifest& manifest) const;
  // Checks an Encode request's prompts against the manifest's limits and kMaxPromptBytes.
  virtual Status ValidateEncode(const std::vector<std::string>& prompts,
                                const PipelineManifest& manifest) const;
  // Working memory per output pixel a request is assumed to need on a GPU until one has been
  // measured (Note [Working memory] in pool/working_memory.h).
  virtual double default_working_bytes_per_pixel() const = 0;
  // Loads a pipeline of this kind from `manifest` (whose kind is this one) onto `device`, its
  // floating-point tensors in `dtype`. All or nothing; errors name the manifest and field.
  virtual StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                                   const c10::Device& device, c10::ScalarType dtype,
                                                   const ResidencyContext& residency) const = 0;

  // The component names of components(), in order.
  std::vector<std::string> ComponentNames() const;
  // What the manifest parser needs to know of the kind.
  KindManifestSpec ManifestSpec() const;
};

}  // namespace qpool
