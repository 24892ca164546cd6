#include "pipeline/pipeline_kinds.h"

#include "pipeline/flux/flux_kind.h"
#include "pipeline/hidream/hidream_kind.h"
#include "pipeline/sd/sd_kind.h"
#include "pipeline/sdxl/sdxl_kind.h"

namespace qpool {

std::shared_ptr<const PipelineKinds> PipelineKinds::Builtin() {
  std::vector<std::unique_ptr<PipelineKind>> kinds;
  kinds.push_back(std::make_unique<SdKind>());
  kinds.push_back(std::make_unique<SdxlKind>());
  kinds.push_back(std::make_unique<FluxKind>());
  kinds.push_back(std::make_unique<HiDreamKind>());
  return std::make_shared<const PipelineKinds>(std::move(kinds));
}

PipelineKinds::PipelineKinds(std::vector<std::unique_ptr<PipelineKind>> kinds)
    : kinds_(std::move(kinds)) {}

const PipelineKind* PipelineKinds::Find(const std::string& name) const {
  for (const auto& kind : kinds_) {
    if (kind->name() == name) return kind.get();
  }
  return nullptr;
}

StatusOr<std::unique_ptr<Pipeline>> PipelineKinds::Load(const PipelineManifest& manifest,
                                                        const c10::Device& device,
                                                        c10::ScalarType dtype,
                                                        const ResidencyContext& residency) const {
  const PipelineKind* kind = Find(manifest.kind);
  if (kind == nullptr) {
    return InvalidArgument(
        StrCat(manifest.path, ": kind '", manifest.kind, "' is not served here"));
  }
  return kind->Load(manifest, device, dtype, residency);
}

KindCatalog PipelineKinds::Catalog() const {
  KindCatalog catalog;
  for (const auto& kind : kinds_) catalog[kind->name()] = kind->ManifestSpec();
  return catalog;
}

}  // namespace qpool
