#include "pipeline/pipeline.h"

#include "pipeline/pipeline_kind.h"
#include "quant/module_quantizer.h"
#include "util/log.h"

namespace qpool {

StatusOr<c10::ScalarType> ResolveDtype(const std::string& name, const c10::Device& device) {
  if (name == "auto") return device.is_cuda() ? c10::kHalf : c10::kFloat;
  if (name == "float32") return c10::kFloat;
  if (name == "float16") return c10::kHalf;
  if (name == "bfloat16") return c10::kBFloat16;
  return InvalidArgument(
      StrCat("unknown dtype '", name, "'; valid: auto, float32, float16, bfloat16"));
}

Status CheckShape(const std::string& what, const torch::Tensor& t, c10::IntArrayRef expected) {
  if (t.sizes() != expected) {
    return Internal(StrCat(what, " returned shape ", t.sizes(), ", expected ", expected,
                           "; the component does not follow its pipeline kind's contract "
                           "(docs/model-repository.md)"));
  }
  return Status::Ok();
}

Pipeline::Pipeline(const PipelineKind& kind, PipelineManifest manifest, c10::ScalarType dtype)
    : kind_(kind), manifest_(std::move(manifest)), dtype_(dtype) {}

Pipeline::~Pipeline() {
  if (residency_) residency_->Unload();
}

Status Pipeline::LoadComponents(const c10::Device& device, const ResidencyContext& residency) {
  std::vector<c10::ScalarType> dtypes;
  for (const ComponentDecl& decl : kind_.components()) {
    const std::string& name = decl.name;
    const ComponentSpec* spec = manifest_.FindComponent(name);
    if (spec == nullptr) {
      return InvalidArgument(StrCat(manifest_.path, ": field 'components.", name, "' is required"));
    }
    if (spec->dtype.empty()) {
      dtypes.push_back(dtype_);
    } else {
      ASSIGN_OR_RETURN(c10::ScalarType own, ResolveDtype(spec->dtype, device));
      dtypes.push_back(own);
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
        return Status(report.status().code(), StrCat(manifest_.path, ": components.", name,
                                                     ".quantization: ", report.status().message()));
      }
      component->Refresh();
      log::Info("pipeline '", manifest_.name, "': quantized ", name, " to ", q.format,
                " at load time");
    }
    components_.push_back(std::move(component));
  }
  std::vector<Component*> components;
  for (auto& c : components_) components.push_back(c.get());
  residency_ =
      std::make_unique<PipelineResidency>(manifest_.name, components, residency, manifest_.offload);
  Status placed = residency_->Place(device, dtypes);
  if (!placed.ok()) return Status(placed.code(), StrCat(manifest_.path, ": ", placed.message()));
  return Status::Ok();
}

Component& Pipeline::component(const std::string& name) {
  for (auto& c : components_) {
    if (c->name() == name) return *c;
  }
  // LoadComponents loaded every component the kind declares.
  throw std::logic_error("pipeline '" + manifest_.name + "' has no component " + name);
}

void Pipeline::UseForwardGraphs(const std::string& name) {
  const ExecutionSpec& e = manifest_.execution;
  component(name).EnableGraphs(e.cuda_graphs ? static_cast<size_t>(e.max_graphs) : 0);
}

StatusOr<GenerateOutput> Pipeline::Generate(const GenerateParams& params,
                                            const ProgressFn& progress,
                                            const CancelledFn& cancelled) {
  StatusOr<GenerateOutput> result = Internal("the pipeline returned no result");
  std::vector<BatchItem> items(1);
  items[0].params = &params;
  items[0].progress = progress;
  items[0].cancelled = cancelled;
  items[0].done = [&result](StatusOr<GenerateOutput> out) { result = std::move(out); };
  GenerateBatch(std::move(items));
  return result;
}

}  // namespace qpool
