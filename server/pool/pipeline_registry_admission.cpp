// PipelineRegistry's routing and admission: leases on the replica the router picks, the memory
// budget of each GPU and the eviction that makes room under it (Note [Memory budget]).
#include <algorithm>
#include <tuple>

#include "pool/eviction.h"
#include "pool/pipeline_registry.h"
#include "util/clock.h"
#include "util/log.h"

namespace qpool {
namespace {

// Bytes of a replica not on its device: what an onload (or, under the sequential policy, the
// groups streamed at once) must add before it can run.
uint64_t OnloadBytes(const Pipeline& pipeline) { return pipeline.residency().BytesToRun(); }

// Width, height and images of `options`, sizes left at 0 taking the manifest's defaults.
std::tuple<int, int, int> SizeOf(const RouteOptions& options, const GenerationDefaults& d) {
  return {options.width > 0 ? options.width : d.width,
          options.height > 0 ? options.height : d.height, std::max(1, options.images)};
}

uint64_t Estimate(const WorkingMemoryModel& model, const RouteOptions& options,
                  const GenerationDefaults& d) {
  const auto [width, height, images] = SizeOf(options, d);
  return model.Estimate(width, height, images);
}

uint64_t BytesOn(const Pipeline& pipeline, const c10::Device& device) {
  const auto bytes = pipeline.residency().BytesByDevice();
  auto it = bytes.find(device.str());
  return it == bytes.end() ? 0 : it->second;
}

}  // namespace

DeviceSnapshot PipelineRegistry::SnapshotOf(const c10::Device& device, const std::string& except) {
  DeviceSnapshot s;
  s.device = device.str();
  s.queued = devices_.worker(device).pending();
  if (!device.is_cuda() || residency_.memory == nullptr) return s;  // no budget on the CPU
  const DeviceMemoryStats stats = residency_.memory->Read(device);
  s.budget_bytes =
      static_cast<uint64_t>(admission_.memory_budget * static_cast<double>(stats.total_bytes));
  s.free_bytes = stats.free_bytes;
  for (const auto& [name, entry] : entries_) {
    for (const auto& r : entry.replicas) {
      const uint64_t bytes = BytesOn(*r.pipeline, device);
      s.used_bytes += bytes;
      if (name != except && !r.changing && r.load->in_flight.load() == 0) {
        s.evictable_bytes += bytes;
      }
    }
  }
  return s;
}

StatusOr<LoadedManifest> PipelineRegistry::Manifest(const std::string& name) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
  return LoadedManifest{entry->manifest, entry->kind};
}

StatusOr<std::unique_ptr<PipelineLease>> PipelineRegistry::Acquire(const std::string& name,
                                                                   const RouteOptions& options) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::optional<c10::Device> scale_out;
  std::function<void(const std::string&, const c10::Device&)> load;
  StatusOr<std::unique_ptr<PipelineLease>> lease = Internal("not routed");
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = AcquireLocked(name, options, &scale_out);
    load = scale_out_;
  }
  if (scale_out && load) load(name, *scale_out);
  return lease;
}

void PipelineRegistry::SetScaleOut(
    std::function<void(const std::string&, const c10::Device&)> load) {
  std::lock_guard<std::mutex> lock(mu_);
  scale_out_ = std::move(load);
}

void PipelineRegistry::EndScaleOut(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) it->second.scaling_out = false;
}

StatusOr<std::unique_ptr<PipelineLease>> PipelineRegistry::AcquireLocked(
    const std::string& name, const RouteOptions& options, std::optional<c10::Device>* scale_out) {
  ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
  if (entry->unloading) {
    return FailedPrecondition(StrCat("pipeline '", name, "' is being unloaded"));
  }
  int queued = 0;
  for (const auto& r : entry->replicas) queued += r.load->in_flight.load();
  const int max_queue = entry->manifest->limits.max_queue;
  if (queued >= max_queue) {
    return ResourceExhausted(StrCat("pipeline '", name, "' has ", queued,
                                    " requests queued or running (limits.max_queue ", max_queue,
                                    "); retry later"));
  }
  std::vector<DeviceSnapshot> devices;
  std::vector<ReplicaSnapshot> replicas;
  for (size_t i = 0; i < entry->replicas.size(); ++i) {
    const Replica& r = entry->replicas[i];
    const c10::Device device = r.pipeline->device();
    devices.push_back(SnapshotOf(device, name));
    ReplicaSnapshot rs;
    rs.id = static_cast<int>(i);
    rs.device = device.str();
    rs.onload_bytes = device.is_cuda() ? OnloadBytes(*r.pipeline) : 0;
    rs.resident = rs.onload_bytes == 0;
    rs.available = !r.changing;
    rs.in_flight = static_cast<size_t>(r.load->in_flight.load());
    rs.pending_steps = static_cast<uint64_t>(std::max<int64_t>(0, r.load->pending_steps.load()));
    replicas.push_back(std::move(rs));
  }
  RouteRequest request;
  request.working_bytes = Estimate(*entry->working, options, entry->manifest->defaults);
  request.exclude = options.exclude;
  const Placement& placement = entry->manifest->placement;
  const size_t max_replicas = static_cast<size_t>(placement.max_replicas);
  if (scale_out_ && !entry->scaling_out && entry->loading.empty() &&
      (max_replicas == 0 || entry->replicas.size() < max_replicas)) {
    auto allowed = devices_.Candidates(placement.device);
    for (const auto& d : allowed.ok() ? *allowed : std::vector<c10::Device>{}) {
      if (FindReplica(*entry, d) != nullptr) continue;
      request.spare_devices.push_back(d.str());
      devices.push_back(SnapshotOf(d, name));
    }
    if (entry->replica_bytes == 0) entry->replica_bytes = ComponentFileBytes(*entry->manifest);
    request.replica_bytes = entry->replica_bytes;
  }
  ASSIGN_OR_RETURN(RouteDecision decision, Route(devices, replicas, request));
  if (!decision.scale_out.empty()) {
    entry->scaling_out = true;
    ++counters_.scale_outs[{name, decision.scale_out}];
    *scale_out = c10::Device(decision.scale_out);
  }
  Replica& chosen = entry->replicas.at(static_cast<size_t>(decision.replica));
  chosen.load->in_flight.fetch_add(1);
  chosen.load->pending_steps.fetch_add(options.steps);
  chosen.load->last_used_ns.store(SteadyNanos());
  ++counters_.routed[{name, decision.device, decision.reason}];
  if (!options.exclude.empty()) ++counters_.retries[name];
  const c10::Device device = chosen.pipeline->device();
  return std::make_unique<PipelineLease>(chosen.pipeline, chosen.load, chosen.batches,
                                         &devices_.worker(device), std::move(decision),
                                         options.steps);
}

StatusOr<HostEvictionPlan> PipelineRegistry::PlanHostRoom(const PipelineManifest& manifest,
                                                          size_t replicas, bool evict) {
  const uint64_t budget = admission_.host_budget_bytes;
  if (budget == 0 || replicas == 0) return HostEvictionPlan{};
  const std::string& name = manifest.name;
  const uint64_t needed = ComponentFileBytes(manifest) * replicas;
  const c10::Device host(c10::kCPU);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t used = 0, idle_bytes = 0;
  std::vector<EvictionCandidate> candidates;
  for (const auto& [other, entry] : entries_) {
    EvictionCandidate c{other, 0, 0, 0, other != name && !entry.unloading};
    for (const auto& r : entry.replicas) {
      c.bytes += BytesOn(*r.pipeline, host);
      c.last_used_ns = std::max<uint64_t>(c.last_used_ns, r.load->last_used_ns.load());
      c.idle = c.idle && !r.changing && r.load->in_flight.load() == 0;
    }
    used += c.bytes;
    if (c.idle) idle_bytes += c.bytes;
    if (c.bytes > 0) candidates.push_back(std::move(c));
  }
  if (used + needed <= budget) return HostEvictionPlan{};
  auto victims = PlanEviction(std::move(candidates), used + needed - budget);
  if (!evict) victims = ResourceExhausted("not evicting");
  if (!victims.ok()) {
    return ResourceExhausted(StrCat("loading '", name, "' needs ", needed,
                                    " bytes of host memory (", replicas,
                                    " replica(s) of its component files); the host budget has ",
                                    budget > used ? budget - used : 0, " free (budget ", budget,
                                    ", ", used, " in use) and idle pipelines hold ", idle_bytes,
                                    " of it; raise --host-memory-budget or "
                                    "unload pipelines"));
  }
  HostEvictionPlan plan;
  for (const EvictionCandidate& victim : *victims) {
    // Cannot fail: mu_ has been held since the candidates were found idle.
    auto devices = MarkUnloading(victim.pipeline, entries_.at(victim.pipeline));
    if (!devices.ok()) return devices.status();
    plan.emplace_back(victim.pipeline, std::move(devices).value());
    ++counters_.host_evictions[victim.pipeline];
    log::Info("unloading idle pipeline '", victim.pipeline, "' (", victim.bytes,
              " bytes of host memory) to make room for loading '", name, "'");
  }
  return plan;
}

Status PipelineRegistry::Admit(PipelineLease& lease, const RouteOptions& options) {
  const Pipeline& pipeline = lease.pipeline();
  const c10::Device device = pipeline.device();
  if (!device.is_cuda()) return Status::Ok();
  uint64_t needed = OnloadBytes(pipeline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(pipeline.manifest().name);
    if (it != entries_.end() && it->second.working) {
      needed += Estimate(*it->second.working, options, pipeline.manifest().defaults);
    }
  }
  return MakeRoom(device, needed, pipeline.manifest().name,
                  StrCat("a request of '", pipeline.manifest().name, "'"));
}

void PipelineRegistry::FitGraphs(PipelineLease& lease) {
  Pipeline& pipeline = lease.pipeline();
  const c10::Device device = pipeline.device();
  if (!device.is_cuda() || residency_.memory == nullptr) return;
  DeviceSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot = SnapshotOf(device, pipeline.manifest().name);
  }
  if (snapshot.used_bytes <= snapshot.budget_bytes) return;
  uint64_t dropped = 0;
  for (const auto& component : pipeline.components()) {
    dropped += component->Bytes().graph;
    component->DropGraphs();
  }
  if (dropped > 0) {
    log::Info("pipeline '", pipeline.manifest().name, "' on ", device.str(), ": dropped ", dropped,
              " bytes of CUDA graphs to stay under the memory budget (", snapshot.used_bytes,
              " bytes held, budget ", snapshot.budget_bytes, ")");
  }
}

Status PipelineRegistry::MakeRoom(const c10::Device& device, uint64_t needed,
                                  const std::string& except, const std::string& what) {
  if (!device.is_cuda() || residency_.memory == nullptr || needed == 0) return Status::Ok();
  std::vector<EvictionCandidate> candidates;
  DeviceSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot = SnapshotOf(device, except);
    for (const auto& [name, entry] : entries_) {
      if (name == except) continue;
      for (size_t i = 0; i < entry.replicas.size(); ++i) {
        const Replica& r = entry.replicas[i];
        const uint64_t bytes = BytesOn(*r.pipeline, device);
        if (bytes == 0) continue;
        candidates.push_back({name, static_cast<int>(i), bytes,
                              static_cast<uint64_t>(r.load->last_used_ns.load()),
                              !r.changing && r.load->in_flight.load() == 0});
      }
    }
  }
  const uint64_t headroom =
      snapshot.budget_bytes > snapshot.used_bytes ? snapshot.budget_bytes - snapshot.used_bytes : 0;
  const uint64_t after = snapshot.used_bytes + needed;  // over budget already: the excess too
  if (after <= snapshot.budget_bytes) return Status::Ok();
  auto plan = PlanEviction(candidates, after - snapshot.budget_bytes);
  if (!plan.ok()) {
    return ResourceExhausted(
        StrCat(what, " needs ", needed, " bytes on ", device.str(), "; its budget has ", headroom,
               " free (budget ", snapshot.budget_bytes, ", ", snapshot.used_bytes,
               " in use) and idle pipelines hold ", snapshot.evictable_bytes, " of it"));
  }
  for (const EvictionCandidate& victim : *plan) {
    auto offloaded = ChangeResidency(victim.pipeline, device, ResidencyChange::kOffload, device);
    if (!offloaded.ok()) {
      return ResourceExhausted(StrCat(what, " needs ", needed, " bytes on ", device.str(),
                                      "; offloading idle pipeline '", victim.pipeline,
                                      "' to make room failed: ", offloaded.status().message()));
    }
    log::Info("evicted pipeline '", victim.pipeline, "' from ", device.str(), " (", victim.bytes,
              " bytes to host memory) for ", what);
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.evictions[{victim.pipeline, device.str()}];
  }
  return Status::Ok();
}

void PipelineRegistry::ObserveWorkingMemory(const std::string& name, const RouteOptions& options,
                                            uint64_t bytes) {
  std::shared_ptr<WorkingMemoryModel> model;
  GenerationDefaults d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end() || !it->second.working) return;
    model = it->second.working;
    d = it->second.manifest->defaults;
  }
  const auto [width, height, images] = SizeOf(options, d);
  model->Observe(width, height, images, bytes);
}

PoolCounters PipelineRegistry::Counters() {
  std::lock_guard<std::mutex> lock(mu_);
  PoolCounters out = counters_;
  for (const auto& [name, entry] : entries_) {
    int queued = 0;
    for (const auto& r : entry.replicas) queued += r.load->in_flight.load();
    if (!entry.replicas.empty()) out.queued[name] = queued;
  }
  return out;
}

}  // namespace qpool
