#include "pool/pipeline_registry.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <utility>

#include "component/compiled_forward.h"
#include "memory/leak_check.h"
#include "util/clock.h"
#include "util/log.h"

namespace qpool {

const char* PipelineStateName(PipelineState state) {
  switch (state) {
    case PipelineState::kAvailable:
      return "available";
    case PipelineState::kLoading:
      return "loading";
    case PipelineState::kLoaded:
      return "loaded";
    case PipelineState::kFailed:
      return "failed";
  }
  return "unknown";
}

namespace {

// The names the manifest uses (placement.dtype), not c10's "Float"/"Half".
std::string DtypeName(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "float32";
    case c10::kHalf:
      return "float16";
    case c10::kBFloat16:
      return "bfloat16";
    default:
      return c10::toString(t);
  }
}

}  // namespace

uint64_t PipelineRegistry::ComponentFileBytes(const PipelineManifest& manifest) {
  uint64_t bytes = 0;
  for (const auto& c : manifest.components) {
    std::error_code error;
    const auto size = std::filesystem::file_size(c.file, error);
    bytes += error ? 0 : static_cast<uint64_t>(size);
    if (c.weights) {
      const auto weights = std::filesystem::file_size(c.weights->file, error);
      bytes += error ? 0 : static_cast<uint64_t>(weights);
    }
  }
  return bytes;
}

PipelineLease::PipelineLease(std::shared_ptr<Pipeline> pipeline, std::shared_ptr<ReplicaLoad> load,
                             std::shared_ptr<BatchQueue> batches, DeviceWorker* worker,
                             RouteDecision route, int steps)
    : pipeline_(std::move(pipeline)),
      load_(std::move(load)),
      batches_(std::move(batches)),
      worker_(worker),
      route_(std::move(route)),
      steps_left_(steps) {}

PipelineLease::~PipelineLease() {
  pipeline_.reset();
  load_->pending_steps.fetch_sub(steps_left_);
  load_->last_used_ns.store(SteadyNanos());
  load_->in_flight.fetch_sub(1);
}

void PipelineLease::StepDone() {
  if (steps_left_ <= 0) return;
  --steps_left_;
  load_->pending_steps.fetch_sub(1);
}

PipelineRegistry::PipelineRegistry(ModelRepository repository,
                                   std::shared_ptr<const PipelineKinds> kinds, DevicePool& devices,
                                   ResidencyContext residency, AdmissionOptions admission)
    : repository_(std::move(repository)),
      kinds_(std::move(kinds)),
      devices_(devices),
      residency_(residency),
      admission_(admission) {}

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
  e.leaked_bytes = leaked;
  e.message = status.ok() ? (leaked > 0 ? StrCat(leaked, " bytes were not released") : "")
                          : status.message();
  residency_.events->Append(std::move(e));
}

PipelineStatus PipelineRegistry::StatusOf(const std::string& name, const Entry& entry) const {
  PipelineStatus status;
  status.name = name;
  status.error = entry.error;
  status.state = !entry.replicas.empty()  ? PipelineState::kLoaded
                 : !entry.loading.empty() ? PipelineState::kLoading
                 : !entry.error.empty()   ? PipelineState::kFailed
                                          : PipelineState::kAvailable;
  for (const auto& replica : entry.replicas) {
    const Pipeline& p = *replica.pipeline;
    ReplicaStatus rs;
    rs.device = p.device().str();
    rs.in_flight = static_cast<uint32_t>(replica.load->in_flight.load());
    const auto places = p.residency().Snapshot();
    size_t on_device = 0;
    for (const auto& place : places) {
      if (place.state == Residency::kDevice) ++on_device;
      rs.host_bytes += place.host_bytes;
    }
    rs.residency = on_device == places.size() ? "device" : on_device == 0 ? "host" : "partial";
    const auto bytes = p.residency().BytesByDevice();
    auto it = bytes.find(rs.device);
    rs.device_bytes = it == bytes.end() ? 0 : it->second;
    for (const auto& c : p.components()) {
      const CompiledForward* compiled = std::as_const(*c).compiled();
      rs.forwards.push_back({c->name(), c->forwards(), c->compiled_forwards(), compiled != nullptr,
                             compiled ? compiled->attention() : ""});
    }
    status.in_flight += rs.in_flight;
    status.replicas.push_back(std::move(rs));
  }
  if (entry.replicas.empty()) return status;
  const Pipeline& p = *entry.replicas.front().pipeline;
  status.kind = p.manifest().kind;
  status.device = p.device().str();
  status.defaults = p.manifest().defaults;
  status.schedulers = SamplerNames(p.kind().schedule());
  status.policy = p.residency().policy();
  status.max_queue = p.manifest().limits.max_queue;
  status.batching = p.manifest().batching;
  status.files_changed = p.FilesChangedSinceLoad();
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
  return status;
}

PipelineRegistry::Replica* PipelineRegistry::FindReplica(Entry& entry, const c10::Device& device) {
  for (auto& replica : entry.replicas) {
    if (replica.pipeline->device() == device) return &replica;
  }
  return nullptr;
}

StatusOr<LoadPlan> PipelineRegistry::PlanLoad(const std::string& name, const std::string& device) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  LoadPlan plan;
  auto manifest = repository_.LoadManifest(name);
  if (!manifest.ok() && manifest.status().code() == StatusCode::kNotFound) {
    return manifest.status();
  }
  if (manifest.ok()) {
    plan.manifest = std::make_shared<const PipelineManifest>(std::move(manifest).value());
  } else {
    plan.manifest = manifest.status();
  }
  const PipelineManifest* m = plan.manifest.ok() ? plan.manifest->get() : nullptr;
  const bool automatic = device.empty() || device == "auto";
  // A broken manifest still "loads" (on the CPU worker) so that Load records its error.
  const std::string wanted = !automatic ? device : (m != nullptr ? m->placement.device : "cpu");
  ASSIGN_OR_RETURN(std::vector<c10::Device> candidates, devices_.Candidates(wanted));
  if (!automatic && candidates.size() > 1) {
    return InvalidArgument(StrCat("name one device to load '", name, "' on (got '", device, "')"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  const bool loaded = it != entries_.end() && !it->second.replicas.empty();
  if (automatic && loaded) return plan;
  std::vector<c10::Device> free;  // candidates without a replica
  for (const auto& d : candidates) {
    if (it == entries_.end() || FindReplica(it->second, d) == nullptr) free.push_back(d);
  }
  // Most room first: the least attributed bytes, then the lowest index (stable).
  std::map<std::string, uint64_t> used;
  for (const auto& [n, e] : entries_) {
    for (const auto& r : e.replicas) {
      for (const auto& [d, bytes] : r.pipeline->residency().BytesByDevice()) used[d] += bytes;
    }
  }
  std::stable_sort(free.begin(), free.end(), [&](const c10::Device& a, const c10::Device& b) {
    return used[a.str()] < used[b.str()];
  });
  const int replicas = m != nullptr ? m->placement.replicas : 1;
  if (automatic && replicas > 0 && free.size() > static_cast<size_t>(replicas)) {
    free.erase(free.begin() + replicas, free.end());
  }
  plan.devices = std::move(free);
  return plan;
}

std::shared_ptr<WorkingMemoryModel> PipelineRegistry::NewWorkingModel(
    const PipelineKind& kind) const {
  const uint64_t rate = admission_.default_working_bytes_per_pixel;
  return std::make_shared<WorkingMemoryModel>(rate > 0 ? static_cast<double>(rate)
                                                       : kind.default_working_bytes_per_pixel());
}

StatusOr<LoadResult> PipelineRegistry::Load(
    const std::string& name, const StatusOr<std::shared_ptr<const PipelineManifest>>& manifest,
    const c10::Device& target) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidatePipelineName(name));
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = entries_[name];
    if (entry.loading.count(target.str())) {
      return FailedPrecondition(
          StrCat("pipeline '", name, "' is being loaded on ", target.str(), "; retry shortly"));
    }
    if (FindReplica(entry, target) != nullptr) {
      return LoadResult{StatusOf(name, entry), 0.0, true, {}};
    }
    if (entry.unloading) {
      return Unavailable(StrCat("pipeline '", name, "' is being unloaded; retry shortly"));
    }
    entry.loading.insert(target.str());
    entry.error.clear();
  }

  auto fail = [&](const Status& status) -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = entries_[name];
    entry.loading.erase(target.str());
    entry.error = status.message();
    log::Error("loading pipeline '", name, "' on ", target.str(), " failed: ", status.message());
    return status;
  };
  if (!manifest.ok()) return fail(manifest.status());
  const PipelineManifest& m = **manifest;
  const PipelineKind* kind = kinds_->Find(m.kind);
  if (kind == nullptr) {  // the repository parses with these kinds' catalog
    return fail(InvalidArgument(StrCat(m.path, ": kind '", m.kind, "' is not served here")));
  }
  if (Status defaults = kind->CheckDefaults(m); !defaults.ok()) return fail(defaults);
  std::optional<GenerateParams> warmup;  // Note [Warm-up at load]
  if (m.execution.warmup) {
    GenerateRequestIn in;
    in.pipeline = name;
    in.prompt = kWarmupPrompt;
    in.steps = kWarmupSteps;
    in.seed = 0;
    auto params = kind->ResolveGenerate(in, m);
    if (!params.ok()) return fail(params.status());
    warmup = std::move(params).value();
  }
  auto dtype = ResolveDtype(m.placement.dtype, target);
  if (!dtype.ok()) {
    return fail(
        InvalidArgument(StrCat(m.path, ": field 'placement.dtype': ", dtype.status().message())));
  }
  // Under model and sequential offload a load leaves everything in host memory: requests make
  // their own room (Admit), so a pipeline larger than the budget can still be served.
  if (target.is_cuda() && !RestsOnHost(m.offload.mode)) {
    // The component files are what the load puts on the device (at most: load-time
    // quantization shrinks them); room for them is made before anything is allocated.
    const uint64_t file_bytes = ComponentFileBytes(m);
    const uint64_t warmup_bytes =
        warmup ? NewWorkingModel(*kind)->Estimate(warmup->width, warmup->height, 1) : 0;
    Status room =
        MakeRoom(target, file_bytes + warmup_bytes, name,
                 StrCat("loading '", name, "' (", file_bytes, " bytes of components",
                        warmup ? StrCat(" and ", warmup_bytes, " for its warm-up") : "", ")"));
    if (!room.ok()) return fail(room);
  }
  const DeviceMemoryStats before =
      residency_.memory ? residency_.memory->Read(target) : DeviceMemoryStats{};
  auto pipeline = kind->Load(m, target, *dtype, residency_);
  double warmup_seconds = 0;
  if (pipeline.ok() && warmup) {  // before the replica is registered: no request reaches it first
    const auto warm_start = std::chrono::steady_clock::now();
    auto image = (*pipeline)->Generate(*warmup, nullptr, nullptr);
    warmup_seconds = SecondsSince(warm_start);
    if (image.ok()) {
      log::Info("warmed up pipeline '", name, "' on ", target.str(), " in ", warmup_seconds, " s");
    } else {  // drops the pipeline and all its memory before the event reads the device
      pipeline = Status(image.status().code(),
                        StrCat("warm-up of '", name, "' on ", target.str(),
                               " (execution.warmup) failed: ", image.status().message()));
    }
  }
  const double seconds = SecondsSince(start);
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
  result.load_seconds = SecondsSince(start);
  result.stages = (*pipeline)->load_stages();
  result.stages.warmup_seconds = warmup_seconds;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = entries_[name];
  entry.loading.erase(target.str());
  Replica replica;
  replica.pipeline = std::shared_ptr<Pipeline>(std::move(pipeline).value());
  replica.batches = std::make_shared<BatchQueue>(replica.pipeline->manifest().batching);
  replica.load->last_used_ns.store(SteadyNanos());
  if (entry.replicas.empty()) {
    entry.manifest = *manifest;
    entry.kind = kind;
    entry.working = NewWorkingModel(*kind);
  }
  entry.replicas.push_back(std::move(replica));
  result.pipeline = StatusOf(name, entry);
  uint64_t bytes = 0;
  for (const auto& c : result.pipeline.components) bytes += c.bytes.total();
  const LoadStages& st = result.stages;  // Note [Load stages]
  log::Info("loaded pipeline '", name, "' on ", target.str(), " (", DtypeName(*dtype), ", ", bytes,
            " bytes, replica ", entry.replicas.size(), ") in ", result.load_seconds,
            " s: files read ", st.read_seconds, " s (", st.read_bytes, " bytes), verified ",
            st.verify_seconds, " s, quantized ", st.quantize_seconds, " s, packed on the host ",
            st.pack_seconds, " s, copied to the device ", st.device_seconds, " s, warm-up ",
            st.warmup_seconds, " s");
  return result;
}

StatusOr<PipelineRegistry::Entry*> PipelineRegistry::LoadedEntry(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.replicas.empty()) {
    const auto names = repository_.ListNames();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return NotFound(StrCat("no pipeline named '", name, "' in the model repository"));
    }
    if (it != entries_.end() && !it->second.loading.empty()) {
      return FailedPrecondition(StrCat("pipeline '", name, "' is being loaded; retry shortly"));
    }
    return FailedPrecondition(
        StrCat("pipeline '", name,
               "' is not loaded; load it first (ModelService.LoadPipeline), or run the server "
               "with --load-on-demand on"));
  }
  return &it->second;
}

StatusOr<std::vector<c10::Device>> PipelineRegistry::BeginUnload(const std::string& name) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
  return MarkUnloading(name, *entry);
}

StatusOr<std::vector<c10::Device>> PipelineRegistry::MarkUnloading(const std::string& name,
                                                                   Entry& entry) {
  if (entry.unloading) {
    return FailedPrecondition(StrCat("pipeline '", name, "' is being unloaded"));
  }
  int in_flight = 0;
  for (const auto& r : entry.replicas) {
    if (r.changing)
      return Unavailable(StrCat("pipeline '", name, "' is being moved; retry shortly"));
    in_flight += r.load->in_flight.load();
  }
  if (in_flight > 0) {
    return FailedPrecondition(StrCat("pipeline '", name, "' has ", in_flight,
                                     " request(s) in flight; retry when it is idle"));
  }
  std::vector<c10::Device> out;
  for (auto& r : entry.replicas) {
    r.changing = true;
    out.push_back(r.pipeline->device());
  }
  entry.unloading = true;
  return out;
}

void PipelineRegistry::EndUnload(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  it->second.unloading = false;
  for (auto& r : it->second.replicas) r.changing = false;
  if (it->second.replicas.empty() && it->second.loading.empty() && it->second.error.empty()) {
    entries_.erase(it);
  }
}

StatusOr<UnloadResult> PipelineRegistry::Unload(const std::string& name,
                                                const c10::Device& device) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Pipeline> dropped;
  UnloadResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
    Replica* replica = FindReplica(*entry, device);
    if (replica == nullptr) {
      return FailedPrecondition(StrCat("pipeline '", name, "' has no replica on ", device.str()));
    }
    const int in_flight = replica->load->in_flight.load();
    if (in_flight > 0) {
      return FailedPrecondition(StrCat("pipeline '", name, "' has ", in_flight,
                                       " request(s) in flight on ", device.str(),
                                       "; retry when it is idle"));
    }
    if (replica->changing && !entry->unloading) {
      return Unavailable(StrCat("pipeline '", name, "' is being moved; retry shortly"));
    }
    dropped = std::move(replica->pipeline);
    entry->replicas.erase(entry->replicas.begin() + (replica - entry->replicas.data()));
    if (entry->replicas.empty() && !entry->unloading) entries_.erase(name);
  }
  // Note [Leak check]
  const auto attributed = dropped->residency().BytesByDevice();
  for (const auto& [d, bytes] : attributed) result.freed_bytes += bytes;
  LeakCheck check(residency_.memory, dropped->residency().Blocks(), device);
  dropped.reset();  // the last reference: every block of every component is freed here
  const LeakReport leak = check.Finish();
  result.leaked_bytes = leak.leaked_bytes();
  const double seconds = SecondsSince(start);
  for (const auto& d : check.devices()) {
    auto it = attributed.find(d.str());
    const int64_t delta = it == attributed.end() ? 0 : -static_cast<int64_t>(it->second);
    if (delta == 0 && !(d == device)) continue;
    RecordEvent(MemoryEventKind::kUnload, name, d, check.before(d), delta, seconds, Status::Ok());
  }
  if (result.leaked_bytes > 0) {
    leaked_total_ += result.leaked_bytes;
    log::Error("unloading pipeline '", name, "' from ", device.str(), " left ", result.leaked_bytes,
               " bytes behind (", leak.retained_bytes, " in blocks something still references, ",
               leak.shortfall_bytes, " bytes the allocator did not get back)");
    RecordEvent(MemoryEventKind::kLeak, name, device, check.before(device), 0, seconds,
                Status::Ok(), result.leaked_bytes);
  }
  log::Info("unloaded pipeline '", name, "' from ", device.str(), " (", result.freed_bytes,
            " bytes)");
  return result;
}

std::map<std::string, uint64_t> PipelineRegistry::AttributedBytes() {
  std::map<std::string, uint64_t> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : entries_) {
    for (const auto& r : entry.replicas) {
      for (const auto& [d, bytes] : r.pipeline->residency().BytesByDevice()) out[d] += bytes;
    }
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
    // A loaded pipeline whose folder was deleted since still serves, so it is listed too (it
    // was hidden while it answered requests).
    for (const auto& [name, entry] : entries_) {
      if (std::find(names.begin(), names.end(), name) != names.end()) continue;
      PipelineStatus status = StatusOf(name, entry);
      if (status.state != PipelineState::kLoaded && status.state != PipelineState::kLoading) {
        continue;
      }
      status.name = name;
      out.push_back(std::move(status));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const PipelineStatus& a, const PipelineStatus& b) { return a.name < b.name; });
  // Not loaded: show what the manifest says (file reads without the mutex), or, when it does not
  // parse, the pipeline as failed with the manifest's error.
  for (auto& status : out) {
    if (status.state == PipelineState::kLoaded || status.state == PipelineState::kLoading) {
      continue;
    }
    auto manifest = repository_.LoadManifest(status.name);
    if (manifest.ok()) {
      status.kind = manifest->kind;
      status.defaults = manifest->defaults;
      if (const PipelineKind* kind = kinds_->Find(manifest->kind)) {
        status.schedulers = SamplerNames(kind->schedule());
        if (Status defaults = kind->CheckDefaults(*manifest);
            !defaults.ok() && status.error.empty()) {
          status.state = PipelineState::kFailed;
          status.error = defaults.message();
        }
      }
    } else if (status.error.empty()) {
      status.state = PipelineState::kFailed;
      status.error = manifest.status().message();
    }
  }
  return out;
}

std::optional<PipelineStatus> PipelineRegistry::LoadedStatus(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.replicas.empty()) return std::nullopt;
  return StatusOf(name, it->second);
}

std::vector<PipelineStatus> PipelineRegistry::ListLoaded() {
  std::vector<PipelineStatus> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : entries_) {
    if (!entry.replicas.empty()) out.push_back(StatusOf(name, entry));
  }
  return out;
}

}  // namespace qpool
