#include "pipeline/pipeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <memory>

#include "component/weights_file.h"
#include "pipeline/pipeline_kind.h"
#include "quant/module_quantizer.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/model_file.h"
#include "util/png_encoder.h"

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

namespace {

// Note [Component signatures]
// A component file that is not what its manifest entry says (a VAE decoder saved as unet.pt,
// an SD 1.x UNet in an SDXL folder) used to load and fail only in its first request, with an
// Internal error from deep inside the interpreter. Each kind declares the arguments and outputs
// of its components' forward (ComponentDecl), and a load checks the TorchScript schema against
// them: the number of arguments after self, and a tensor or a tuple of that many tensors
// returned. Shapes cannot be checked without running the component; CheckShape does that at
// run time.
std::string Describe(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

Status CheckSignature(const ComponentDecl& decl, Component& component, const std::string& file,
                      const std::string& kind) {
  const c10::FunctionSchema& schema =
      component.module().get_method("forward").function().getSchema();
  const size_t inputs = schema.arguments().empty() ? 0 : schema.arguments().size() - 1;
  size_t outputs = 0;
  if (schema.returns().size() == 1) {
    const c10::TypePtr& type = schema.returns()[0].type();
    if (type->kind() == c10::TypeKind::TensorType) {
      outputs = 1;
    } else if (auto tuple = type->cast<c10::TupleType>()) {
      outputs = tuple->elements().size();
      for (const auto& e : tuple->elements()) {
        if (e->kind() != c10::TypeKind::TensorType) outputs = 0;
      }
      if (outputs == 1) outputs = 0;  // a tuple of one is not a tensor
    }
  }
  if (inputs == decl.inputs.size() && outputs == decl.outputs) return Status::Ok();
  const std::string want_out =
      decl.outputs == 1 ? "a tensor" : StrCat("a tuple of ", decl.outputs, " tensors");
  return InvalidArgument(StrCat(
      file, ": its forward takes ", inputs, " argument(s) and returns ",
      schema.returns().size() == 1 ? schema.returns()[0].type()->str() : "several values", "; a ",
      decl.name, " of kind ", kind, " takes ", decl.inputs.size(), " (", Describe(decl.inputs),
      ") and returns ", want_out, " (docs/model-repository.md, component contract)"));
}

}  // namespace

Pipeline::Pipeline(const PipelineKind& kind, PipelineManifest manifest, c10::ScalarType dtype)
    : kind_(kind), manifest_(std::move(manifest)), dtype_(dtype) {}

Pipeline::~Pipeline() {
  if (residency_) residency_->Unload();
}

Status Pipeline::LoadComponents(const c10::Device& device, const ResidencyContext& residency) {
  using Clock = std::chrono::steady_clock;
  LoadStages& stages = load_stages_;  // Note [Load stages]
  // Note [One descriptor per file]: each file is opened once, inside the model repository, and
  // its digest, its load and the check that it did not change meanwhile all go through that
  // descriptor. Note [File digests]: every file's digest at once, each on its own thread, so that
  // hashing one component overlaps reading the ones before it; a file is still read only after
  // its own digest matched (Note [Load errors]).
  const std::string repository = std::filesystem::path(manifest_.dir).parent_path().string();
  std::map<std::string, std::shared_ptr<const ModelFile>> files;
  std::map<std::string, std::shared_future<StatusOr<std::string>>> digests;
  const auto open = [&](const std::string& path, const std::string& sha256,
                        const std::string& field) -> Status {
    if (files.count(path) != 0) return Status::Ok();
    StatusOr<std::unique_ptr<ModelFile>> opened = ModelFile::Open(path, repository);
    if (!opened.ok()) {
      return InvalidArgument(StrCat(manifest_.path, ": ", field, " ", opened.status().message()));
    }
    std::shared_ptr<const ModelFile> file = std::move(*opened);
    files.emplace(path, file);
    if (!sha256.empty()) {
      digests.emplace(path,
                      std::async(std::launch::async, [file] { return file->Sha256(); }).share());
    }
    return Status::Ok();
  };
  const auto verify = [&](const std::string& path, const std::string& sha256,
                          const std::string& field) -> Status {
    if (sha256.empty()) return Status::Ok();
    // Note [File digests].
    ASSIGN_OR_RETURN(std::string digest, digests.at(path).get());
    if (digest != sha256) {
      return InvalidArgument(StrCat(manifest_.path, ": ", field, " ", path, " has SHA-256 ", digest,
                                    ", the manifest records ", sha256,
                                    ": the file is corrupt or not this component's"));
    }
    return Status::Ok();
  };
  for (const ComponentDecl& decl : kind_.components()) {
    const ComponentSpec* spec = manifest_.FindComponent(decl.name);
    if (spec == nullptr) continue;
    const std::string field = StrCat("components.", decl.name);
    RETURN_IF_ERROR(open(spec->file, spec->sha256, field + ".file"));
    if (spec->weights) {
      RETURN_IF_ERROR(open(spec->weights->file, spec->weights->sha256, field + ".weights.file"));
    }
  }
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
    const ModelFile& file = *files.at(spec->file);
    const ModelFile* weights = spec->weights ? files.at(spec->weights->file).get() : nullptr;
    const std::string field = StrCat("components.", name);
    auto stage_start = Clock::now();
    RETURN_IF_ERROR(verify(spec->file, spec->sha256, field + ".file"));
    if (weights != nullptr) {
      RETURN_IF_ERROR(verify(spec->weights->file, spec->weights->sha256, field + ".weights.file"));
    }
    stages.verify_seconds += SecondsSince(stage_start);
    stage_start = Clock::now();
    ASSIGN_OR_RETURN(auto component, Component::Load(name, file));
    Status unchanged = file.CheckUnchanged();  // Note [One descriptor per file]
    if (!unchanged.ok()) {
      return InvalidArgument(StrCat(manifest_.path, ": ", field, ".file ", unchanged.message()));
    }
    stages.read_bytes += static_cast<uint64_t>(file.size());
    if (weights != nullptr) {  // Note [Weights beside the graph]
      Status bound = BindWeights(*component, *weights);
      if (bound.ok()) bound = weights->CheckUnchanged();
      if (!bound.ok()) {
        return InvalidArgument(
            StrCat(manifest_.path, ": ", field, ".weights.file ", bound.message()));
      }
      stages.read_bytes += static_cast<uint64_t>(weights->size());
    }
    Status holds = CheckHoldsData(spec->file, *component);
    if (!holds.ok()) return InvalidArgument(StrCat(manifest_.path, ": ", holds.message()));
    stages.read_seconds += SecondsSince(stage_start);
    Status signature = CheckSignature(decl, *component, spec->file, kind_.name());
    if (!signature.ok()) {
      return InvalidArgument(
          StrCat(manifest_.path, ": components.", name, ".file ", signature.message()));
    }
    const QuantizationSpec& q = spec->quantization;
    if (q.format != "none" && component->quantization() == "none") {
      quant::QuantSettings settings;
      settings.format = q.format;
      settings.blocksize = q.blocksize;
      settings.double_quant = q.double_quant;
      settings.skip = q.skip;
      settings.min_weights = q.min_weights;
      // On the pipeline's GPU when it has one (Note [Load-time quantization]).
      stage_start = Clock::now();
      auto report = quant::QuantizeModule(
          component->module(), settings,
          device.is_cuda() ? std::optional<c10::Device>(device) : std::nullopt);
      stages.quantize_seconds += SecondsSince(stage_start);
      if (!report.ok()) {
        return Status(report.status().code(), StrCat(manifest_.path, ": components.", name,
                                                     ".quantization: ", report.status().message()));
      }
      component->Refresh();
      if (report->layers_quantized + report->layers_already_quantized > 0) {
        log::Info("pipeline '", manifest_.name, "': quantized ", name, " to ", q.format,
                  " at load time");
      } else {  // Note [Small layers stay float]
        log::Info("pipeline '", manifest_.name, "': ", name, " stays float: its ",
                  report->layers_small, " layers have fewer than ", q.min_weights, " weights");
      }
    }
    if (decl.channels_last && device.is_cuda() &&
        (decl.channels_last_needs.empty() ||
         GraphCalls(component->module(), decl.channels_last_needs))) {
      component->set_weight_memory_format(c10::MemoryFormat::ChannelsLast);
    }
    if (spec->compiled) {  // Note [Compiled forward]
      const c10::DeviceType type = spec->compiled->device == "cuda" ? c10::kCUDA : c10::kCPU;
      Status attached =
          component->AttachCompiled(spec->compiled->file, type, spec->compiled->sha256, repository);
      if (!attached.ok()) {
        return InvalidArgument(
            StrCat(manifest_.path, ": components.", name, ".compiled: ", attached.message()));
      }
    }
    components_.push_back(std::move(component));
  }
  for (const auto& [path, file] : files) loaded_files_.emplace_back(path, file->identity());
  std::vector<Component*> components;
  for (auto& c : components_) components.push_back(c.get());
  residency_ =
      std::make_unique<PipelineResidency>(manifest_.name, components, residency, manifest_.offload);
  PlaceSeconds place_seconds;
  Status placed = residency_->Place(device, dtypes, &place_seconds);
  stages.pack_seconds = place_seconds.pack;
  stages.device_seconds = place_seconds.device;
  if (!placed.ok()) return Status(placed.code(), StrCat(manifest_.path, ": ", placed.message()));
  return Status::Ok();
}

std::vector<std::string> Pipeline::FilesChangedSinceLoad() const {
  std::vector<std::string> changed;
  for (const auto& [path, identity] : loaded_files_) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || IdentityOfStat(st) != identity) changed.push_back(path);
  }
  return changed;
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

void Pipeline::UseEncoderGraphs(Component& encoder) {
  const ExecutionSpec& e = manifest_.execution;
  const OffloadMode mode = residency().policy().mode;
  const bool resident = mode == OffloadMode::kNone || mode == OffloadMode::kIdle;
  encoder.EnableGraphs(e.cuda_graphs && resident ? static_cast<size_t>(e.max_graphs) : 0);
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

StatusOr<torch::Tensor> Pipeline::DecodePixels(Component& decoder, const torch::Tensor& latents) {
  const auto& latent = manifest().latent;
  // The decoder may keep its own dtype (components.vae_decoder.dtype, e.g. float32).
  ASSIGN_OR_RETURN(
      torch::Tensor image,
      decoder.Forward(
          {(latents / latent.scaling_factor + latent.shift_factor).to(decoder.dtype())}));
  const int64_t n = latents.size(0);
  const int64_t height = latents.size(2) * latent.downscale;
  const int64_t width = latents.size(3) * latent.downscale;
  RETURN_IF_ERROR(CheckShape("vae_decoder", image, {n, 3, height, width}));
  return ((image.to(torch::kFloat) / 2 + 0.5).clamp(0, 1) * 255)
      .round()
      .to(torch::kUInt8)
      .permute({0, 2, 3, 1})
      .contiguous()
      .cpu();
}

std::vector<GeneratedImage> Pipeline::EncodePngs(const torch::Tensor& pixels) {
  const int height = static_cast<int>(pixels.size(1));
  const int width = static_cast<int>(pixels.size(2));
  // The images of a batch are encoded a few at once, each in its own parallel pieces (Note
  // [Parallel deflate]): one image's pieces leave most of a many-core host idle.
  constexpr int64_t kImagesAtOnce = 4;
  std::vector<GeneratedImage> images;
  for (int64_t first = 0; first < pixels.size(0); first += kImagesAtOnce) {
    std::vector<std::future<std::string>> pngs;
    for (int64_t i = first; i < std::min(first + kImagesAtOnce, pixels.size(0)); ++i) {
      const uint8_t* rgb = pixels[i].data_ptr<uint8_t>();
      pngs.push_back(std::async(i == first ? std::launch::deferred : std::launch::async,
                                [rgb, width, height] { return EncodePng(rgb, width, height); }));
    }
    for (auto& png : pngs) images.push_back({png.get(), width, height});
  }
  return images;
}

}  // namespace qpool
