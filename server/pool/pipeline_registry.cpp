#include "pool/pipeline_registry.h"

#include <algorithm>
#include <chrono>

#include "util/log.h"

namespace qpool {

const char* PipelineStateName(PipelineState state) {
  switch (state) {
    case PipelineState::kAvailable: return "available";
    case PipelineState::kLoading: return "loading";
    case PipelineState::kLoaded: return "loaded";
    case PipelineState::kFailed: return "failed";
  }
  return "unknown";
}

namespace {

// The names the manifest uses (placement.dtype), not c10's "Float"/"Half".
std::string DtypeName(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

}  // namespace

PipelineRegistry::PipelineRegistry(ModelRepository repository, DevicePool& devices)
    : repository_(std::move(repository)), devices_(devices) {}

PipelineStatus PipelineRegistry::StatusOf(const std::string& name, const Entry& entry) const {
  PipelineStatus status;
  status.name = name;
  status.state = entry.state;
  status.error = entry.error;
  status.in_flight = static_cast<uint32_t>(entry.in_flight->load());
  if (entry.pipeline) {
    const SdPipeline& p = *entry.pipeline;
    status.kind = p.manifest().kind;
    status.device = p.device().str();
    status.defaults = p.manifest().defaults;
    for (const auto& c : p.components()) {
      status.components.push_back({c->name(), c->device().str(),
                                   DtypeName(c->dtype()), c->quantization(),
                                   c->Bytes()});
    }
  }
  return status;
}

StatusOr<c10::Device> PipelineRegistry::PlanDevice(const std::string& name,
                                                   const std::string& device) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  auto manifest = repository_.LoadManifest(name);
  if (!manifest.ok() && manifest.status().code() == StatusCode::kNotFound) {
    return manifest.status();
  }
  // A broken manifest still "loads" (on the CPU worker) so that Load records its error.
  const std::string wanted = (device.empty() || device == "auto")
                                 ? (manifest.ok() ? manifest->placement.device : "cpu")
                                 : device;
  auto loaded_bytes = [this](const c10::Device& d) {
    uint64_t total = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, e] : entries_) {
      if (!e.pipeline || e.pipeline->device() != d) continue;
      for (const auto& c : e.pipeline->components()) total += c->Bytes().total();
    }
    return total;
  };
  return devices_.Resolve(wanted, loaded_bytes);
}

StatusOr<LoadResult> PipelineRegistry::Load(const std::string& name, const std::string& device) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidatePipelineName(name));
  auto planned = PlanDevice(name, device);
  if (!planned.ok()) return planned.status();
  const c10::Device target = *planned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = entries_[name];
    if (entry.state == PipelineState::kLoading) {
      return FailedPrecondition(StrCat("pipeline '", name, "' is being loaded; retry shortly"));
    }
    if (entry.state == PipelineState::kLoaded) {
      const bool explicit_device = !device.empty() && device != "auto";
      if (explicit_device && entry.pipeline->device() != target) {
        return FailedPrecondition(StrCat("pipeline '", name, "' is already loaded on ",
                                         entry.pipeline->device().str(), "; unload it to load it on ",
                                         target.str()));
      }
      return LoadResult{StatusOf(name, entry), 0.0, true};
    }
    entry.state = PipelineState::kLoading;
    entry.error.clear();
  }

  auto fail = [&](const Status& status) -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = entries_[name];
    entry.state = PipelineState::kFailed;
    entry.error = status.message();
    log::Error("loading pipeline '", name, "' failed: ", status.message());
    return status;
  };
  auto manifest = repository_.LoadManifest(name);
  if (!manifest.ok()) return fail(manifest.status());
  auto dtype = ResolveDtype(manifest->placement.dtype, target);
  if (!dtype.ok()) {
    return fail(InvalidArgument(StrCat(manifest->path, ": field 'placement.dtype': ",
                                       dtype.status().message())));
  }
  auto pipeline = SdPipeline::Load(*manifest, target, *dtype);
  if (!pipeline.ok()) return fail(pipeline.status());

  LoadResult result;
  result.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = entries_[name];
  entry.pipeline = std::shared_ptr<SdPipeline>(std::move(pipeline).value());
  entry.state = PipelineState::kLoaded;
  result.pipeline = StatusOf(name, entry);
  uint64_t bytes = 0;
  for (const auto& c : result.pipeline.components) bytes += c.bytes.total();
  log::Info("loaded pipeline '", name, "' on ", target.str(), " (", DtypeName(*dtype), ", ",
            bytes, " bytes) in ", result.load_seconds, " s");
  return result;
}

StatusOr<uint64_t> PipelineRegistry::Unload(const std::string& name) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::shared_ptr<SdPipeline> dropped;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end() || it->second.state != PipelineState::kLoaded) {
      const auto names = repository_.ListNames();
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        return NotFound(StrCat("no pipeline named '", name, "' in the model repository"));
      }
      if (it != entries_.end() && it->second.state == PipelineState::kLoading) {
        return FailedPrecondition(StrCat("pipeline '", name, "' is being loaded; retry shortly"));
      }
      return FailedPrecondition(StrCat("pipeline '", name, "' is not loaded"));
    }
    Entry& entry = it->second;
    const int in_flight = entry.in_flight->load();
    if (in_flight > 0) {
      return FailedPrecondition(StrCat("pipeline '", name, "' has ", in_flight,
                                       " request(s) in flight; retry when it is idle"));
    }
    for (const auto& c : entry.pipeline->components()) bytes += c->Bytes().total();
    dropped = std::move(entry.pipeline);
    entries_.erase(it);
  }
  // The last reference: every tensor of every component is freed here.
  dropped.reset();
  log::Info("unloaded pipeline '", name, "' (", bytes, " bytes)");
  return bytes;
}

std::vector<PipelineStatus> PipelineRegistry::List() {
  std::vector<PipelineStatus> out;
  const auto names = repository_.ListNames();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& name : names) {
      auto it = entries_.find(name);
      PipelineStatus status = it == entries_.end() ? PipelineStatus{} : StatusOf(name, it->second);
      status.name = name;
      out.push_back(std::move(status));
    }
  }
  // Not loaded: show what the manifest says, if it parses (file reads without the mutex).
  for (auto& status : out) {
    if (status.state == PipelineState::kLoaded) continue;
    auto manifest = repository_.LoadManifest(status.name);
    if (manifest.ok()) {
      status.kind = manifest->kind;
      status.defaults = manifest->defaults;
    }
  }
  return out;
}

std::vector<PipelineStatus> PipelineRegistry::ListLoaded() {
  std::vector<PipelineStatus> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : entries_) {
    if (entry.state == PipelineState::kLoaded) out.push_back(StatusOf(name, entry));
  }
  return out;
}

StatusOr<std::unique_ptr<PipelineLease>> PipelineRegistry::Acquire(const std::string& name) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.state != PipelineState::kLoaded) {
    const auto names = repository_.ListNames();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return NotFound(StrCat("no pipeline named '", name, "' in the model repository"));
    }
    return FailedPrecondition(
        StrCat("pipeline '", name, "' is not loaded; load it first (ModelService.LoadPipeline)"));
  }
  Entry& entry = it->second;
  entry.in_flight->fetch_add(1);
  return std::make_unique<PipelineLease>(entry.pipeline, entry.in_flight,
                                         &devices_.worker(entry.pipeline->device()));
}

}  // namespace qpool
