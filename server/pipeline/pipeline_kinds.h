// PipelineKinds: the pipeline kinds a server serves, keyed by the manifest's `kind:`
// (Note [Pipeline kinds] in pipeline/pipeline_kind.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/manifest.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_kind.h"

namespace qpool {

// Thread safety: immutable after construction.
class PipelineKinds {
 public:
  // Every kind qpool ships (the one list to extend when a kind is added).
  static std::shared_ptr<const PipelineKinds> Builtin();

  // `kinds` must have distinct names.
  explicit PipelineKinds(std::vector<std::unique_ptr<PipelineKind>> kinds);

  // The kind called `name`, or nullptr.
  const PipelineKind* Find(const std::string& name) const;
  // The component names of every kind, for the manifest parser.
  KindCatalog Catalog() const;
  // Loads `manifest` with its kind (PipelineKind::Load); InvalidArgument naming the manifest for
  // a kind not here.
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                           const c10::Device& device, c10::ScalarType dtype,
                                           const ResidencyContext& residency) const;

 private:
  std::vector<std::unique_ptr<PipelineKind>> kinds_;
};

}  // namespace qpool
