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

PipelineRegistry::PipelineRegistry(ModelRepository repository, DevicePool& devices,
                                   ResidencyContext residency)
    : repository_(std::move(repository)), devices_(devices), residency_(residency) {}

void PipelineRegistry::RecordEvent(MemoryEventKind kind, const std::string& name,
                                   const c10::Device& device, const DeviceMemoryStats& before,
                                   int64_t delta, double seconds, const Status& status,
                                   uint64_t leaked) {
  if (residency_.events == nullptr) return;
  MemoryEvent e;
  e.kind = kind;
  e.pipeline = name;
  e.device = device.str();
  const DeviceMemoryStats after =
      residency_.memory ? residency_.memory->Read(device) : DeviceMemoryStats{};
  e.allocated_before = before.allocated_bytes;
  e.allocated_after = after.allocated_bytes;
  e.reserved_before = before.reserved_bytes;
  e.reserved_after = after.reserved_bytes;
  e.attributed_delta = delta;
  e.duration_seconds = seconds;
  e.outcome = !status.ok() ? MemoryEventOutcome::kError
                           : (leaked > 0 ? MemoryEventOutcome::kLeak : MemoryEventOutcome::kOk);
  e.message = status.ok() ? (leaked > 0 ? StrCat(leaked, " bytes were not released") : "")
                          : status.message();
  residency_.events->Append(std::move(e));
}

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
    status.policy = p.residency().policy();
    const auto places = p.residency().Snapshot();
    for (size_t i = 0; i < p.components().size(); ++i) {
      const auto& c = p.components()[i];
      ComponentStatus cs;
      cs.name = c->name();
      cs.device = c->device().str();
      cs.dtype = DtypeName(c->dtype());
      cs.quantization = c->quantization();
      cs.bytes = c->Bytes();
      cs.residency = ResidencyName(places[i].state);
      cs.host_bytes = places[i].host_bytes;
      status.components.push_back(std::move(cs));
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
      if (!e.pipeline) continue;
      const auto bytes = e.pipeline->residency().BytesByDevice();
      auto it = bytes.find(d.str());
      if (it != bytes.end()) total += it->second;
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
  const DeviceMemoryStats before =
      residency_.memory ? residency_.memory->Read(target) : DeviceMemoryStats{};
  auto pipeline = SdPipeline::Load(*manifest, target, *dtype, residency_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!pipeline.ok()) {
    RecordEvent(MemoryEventKind::kLoad, name, target, before, 0, seconds, pipeline.status());
    return fail(pipeline.status());
  }
  {
    const auto bytes = (*pipeline)->residency().BytesByDevice();
    auto it = bytes.find(target.str());
    RecordEvent(MemoryEventKind::kLoad, name, target, before,
                it == bytes.end() ? 0 : static_cast<int64_t>(it->second), seconds, Status::Ok());
  }

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

StatusOr<PipelineRegistry::Entry*> PipelineRegistry::LoadedEntry(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.state != PipelineState::kLoaded) {
    const auto names = repository_.ListNames();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return NotFound(StrCat("no pipeline named '", name, "' in the model repository"));
    }
    if (it != entries_.end() && it->second.state == PipelineState::kLoading) {
      return FailedPrecondition(StrCat("pipeline '", name, "' is being loaded; retry shortly"));
    }
    return FailedPrecondition(
        StrCat("pipeline '", name, "' is not loaded; load it first (ModelService.LoadPipeline)"));
  }
  return &it->second;
}

StatusOr<PipelineRegistry::Entry*> PipelineRegistry::IdleEntry(const std::string& name) {
  ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
  if (entry->changing) {
    return Unavailable(StrCat("pipeline '", name, "' is being moved; retry shortly"));
  }
  const int in_flight = entry->in_flight->load();
  if (in_flight > 0) {
    return FailedPrecondition(StrCat("pipeline '", name, "' has ", in_flight,
                                     " request(s) in flight; retry when it is idle"));
  }
  return entry;
}

Status PipelineRegistry::CheckUnload(const std::string& name) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::lock_guard<std::mutex> lock(mu_);
  return IdleEntry(name).status();
}

StatusOr<UnloadResult> PipelineRegistry::Unload(const std::string& name) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<SdPipeline> dropped;
  UnloadResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, IdleEntry(name));
    dropped = std::move(entry->pipeline);
    entries_.erase(name);
  }
  // Note [Leak check]
  const c10::Device device = dropped->device();
  const auto blocks = dropped->residency().Blocks();
  const auto attributed = dropped->residency().BytesByDevice();
  for (const auto& [d, bytes] : attributed) result.freed_bytes += bytes;
  std::map<std::string, uint64_t> expected;  // allocator bytes per GPU
  for (const auto& b : blocks) {
    if (b.device.is_cuda()) expected[b.device.str()] += b.allocator_bytes;
  }
  std::map<std::string, DeviceMemoryStats> before;
  std::vector<c10::Device> counted = {c10::Device(c10::kCPU)};
  for (const auto& [d, bytes] : expected) counted.emplace_back(d);
  if (!device.is_cpu() && !expected.count(device.str())) counted.push_back(device);
  if (residency_.memory) {
    for (const auto& d : counted) before[d.str()] = residency_.memory->Read(d);
  }
  dropped.reset();  // the last reference: every block of every component is freed here
  uint64_t retained = 0;
  for (const auto& b : blocks) {
    if (!b.storage.expired()) retained += b.bytes;
  }
  uint64_t shortfall = 0;
  if (residency_.memory) {
    for (const auto& [d, bytes] : expected) {
      const auto after = residency_.memory->Read(c10::Device(d));
      const uint64_t was = before[d].allocated_bytes;
      const uint64_t drop = was > after.allocated_bytes ? was - after.allocated_bytes : 0;
      if (drop < bytes) shortfall += bytes - drop;
    }
  }
  result.leaked_bytes = std::max(retained, shortfall);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& d : counted) {
    auto it = attributed.find(d.str());
    const int64_t delta = it == attributed.end() ? 0 : -static_cast<int64_t>(it->second);
    if (delta == 0 && !(d == device)) continue;
    RecordEvent(MemoryEventKind::kUnload, name, d, before[d.str()], delta, seconds, Status::Ok());
  }
  if (result.leaked_bytes > 0) {
    leaked_total_ += result.leaked_bytes;
    log::Error("unloading pipeline '", name, "' left ", result.leaked_bytes,
               " bytes behind (", retained, " in blocks something still references, ", shortfall,
               " bytes the allocator did not get back)");
    RecordEvent(MemoryEventKind::kLeak, name, device, before[device.str()], 0, seconds,
                Status::Ok(), result.leaked_bytes);
  }
  log::Info("unloaded pipeline '", name, "' (", result.freed_bytes, " bytes)");
  return result;
}

StatusOr<c10::Device> PipelineRegistry::ChangeTarget(const std::string& name, Change change,
                                                     const std::string& device) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  c10::Device current(c10::kCPU);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
    current = entry->pipeline->device();
  }
  if (change == Change::kOffload || device.empty()) {
    if (change == Change::kMove) {
      return InvalidArgument("MovePipeline needs a target device (cpu, cuda:N)");
    }
    return current;
  }
  if (device == "auto") {
    return InvalidArgument("name the target device (cpu, cuda:N); auto is for loads");
  }
  return devices_.Resolve(device, [](const c10::Device&) { return uint64_t{0}; });
}

StatusOr<std::pair<PipelineStatus, ResidencyReport>> PipelineRegistry::ChangeResidency(
    const std::string& name, Change change, const std::string& device) {
  ASSIGN_OR_RETURN(c10::Device target, ChangeTarget(name, change, device));
  std::shared_ptr<SdPipeline> pipeline;
  bool elsewhere = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
    if (entry->changing) {
      return Unavailable(StrCat("pipeline '", name, "' is being moved; retry shortly"));
    }
    pipeline = entry->pipeline;
    elsewhere = change != Change::kOffload && pipeline->device() != target;
    if (elsewhere) {
      const int in_flight = entry->in_flight->load();
      if (in_flight > 0) {
        return FailedPrecondition(StrCat("pipeline '", name, "' has ", in_flight,
                                         " request(s) in flight; retry when it is idle"));
      }
      entry->changing = true;  // Acquire refuses meanwhile
    }
  }
  StatusOr<ResidencyReport> report = Status::Ok();
  switch (change) {
    case Change::kOffload: report = pipeline->residency().Offload(); break;
    case Change::kOnload: report = pipeline->residency().Onload(target); break;
    case Change::kMove: report = pipeline->residency().MoveTo(target); break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) it->second.changing = false;
  if (!report.ok()) return report.status();
  return std::make_pair(StatusOf(name, it->second), std::move(report).value());
}

StatusOr<PipelineStatus> PipelineRegistry::SetPolicy(const std::string& name,
                                                     const OffloadPolicy& policy) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::shared_ptr<SdPipeline> pipeline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
    pipeline = entry->pipeline;
  }
  RETURN_IF_ERROR(pipeline->residency().SetPolicy(policy));
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
  return StatusOf(name, *entry);
}

std::vector<std::string> PipelineRegistry::IdleOffloadsDue() {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : entries_) {
    if (entry.pipeline && !entry.changing && entry.in_flight->load() == 0 &&
        entry.pipeline->residency().IdleOffloadDue()) {
      out.push_back(name);
    }
  }
  return out;
}

std::map<std::string, uint64_t> PipelineRegistry::AttributedBytes() {
  std::map<std::string, uint64_t> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : entries_) {
    if (!entry.pipeline) continue;
    for (const auto& [d, bytes] : entry.pipeline->residency().BytesByDevice()) out[d] += bytes;
  }
  return out;
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
  if (entry.changing) {
    return Unavailable(StrCat("pipeline '", name, "' is being moved to another device; retry "
                              "shortly"));
  }
  entry.in_flight->fetch_add(1);
  return std::make_unique<PipelineLease>(entry.pipeline, entry.in_flight,
                                         &devices_.worker(entry.pipeline->device()));
}

}  // namespace qpool
