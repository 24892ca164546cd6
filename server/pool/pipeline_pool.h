// PipelinePool: the engine's one front door. The gRPC services and main call only this: load,
// unload and residency changes of pipelines, their requests, and what they hold.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_repository.h"
#include "config/offload_policy.h"
#include "memory/device_memory.h"
#include "memory/memory_breakdown.h"
#include "memory/memory_event_log.h"
#include "metrics/metrics_registry.h"
#include "pipeline/pipeline_kinds.h"
#include "pool/admission_options.h"
#include "pool/device_pool.h"
#include "pool/pipeline_status.h"
#include "pool/pool_request.h"
#include "pool/request_metrics.h"
#include "pool/request_run.h"
#include "residency/pipeline_residency.h"
#include "util/status.h"

namespace qpool {

class IdleOffloader;
class OnDemandLoader;
class PipelineRegistry;
class PoolMetrics;
class RequestMetrics;

struct PoolOptions {
  AdmissionOptions admission;
  // A request for a pipeline that is not loaded loads it first (--load-on-demand); off, it gets
  // FailedPrecondition.
  bool load_on_demand = false;
  // How often the idle policy's timeouts are checked: well under any sensible idle_seconds.
  std::chrono::milliseconds idle_check_period{500};
};

// What a residency change did, every replica's moves in turn, and the pipeline afterwards.
struct ChangeResult {
  ResidencyReport report;  // moves of every replica; bytes and seconds summed
  PipelineStatus pipeline;
};

// What an EmptyCache did, per device asked for.
struct EmptyCacheResult {
  std::vector<DeviceMemoryStats> before;
  std::vector<DeviceMemoryStats> after;
  uint64_t released_bytes = 0;  // reserved bytes given back to the driver, all devices
};

// GetMemoryReport's answer.
struct MemoryReport {
  struct Device {
    DeviceMemoryStats stats;
    uint64_t pipeline_bytes = 0;  // attributed to loaded pipelines ("cpu": their host copies)
    std::optional<MemoryBreakdown> breakdown;  // GPUs (Note [Memory arithmetic])
  };
  std::vector<Device> devices;
  std::vector<PipelineStatus> pipelines;  // loaded ones
  uint64_t pinned_host_bytes = 0;
  uint64_t leaked_bytes_total = 0;
  std::vector<MemoryEvent> events;  // the most recent, oldest first
  uint64_t first_event_available = 0;
  uint64_t last_sequence = 0;
};

// What the pool is doing at one instant, for balancers (Note [Agent weight] in
// api/agent_weight.h). Plain values, read without stopping any request.
struct PoolLoad {
  int in_flight = 0;       // requests queued or running, every pipeline
  int queue_capacity = 0;  // limits.max_queue of the loaded pipelines, summed
  // Tasks (requests, loads, moves) waiting or running on the workers of the serving devices.
  size_t device_tasks = 0;
  // Devices holding a replica of a loaded pipeline (each has one worker); at least 1.
  size_t serving_devices = 1;
  uint64_t budget_bytes = 0;     // GPUs: --memory-budget of their memory, summed; 0 without GPUs
  uint64_t allocated_bytes = 0;  // GPUs: what their caching allocators hand out, summed
  int loaded_pipelines = 0;
  // Loaded pipelines with a replica whose every component is on its device (a CPU replica is).
  int resident_pipelines = 0;
  bool draining = false;  // BeginDrain was called
};

// Note [Pool front door]
// Every operation is one verb here. The verbs that change a pipeline run on the workers of the
// devices they touch (PipelineRegistry's protocols: plan under the registry's mutex, one step per
// device on its worker, finish), so they are ordered with that device's requests and nothing
// else allocates there meanwhile; they end by calling `done` exactly once, on a worker or on the
// caller's thread when they fail before anything was queued. Requests are acquired, admitted,
// retried once on another device after running out of memory, and measured here (RequestRun).
//
// Thread safety: every method may be called from any thread. The borrowed objects must outlive
// the pool; Stop() (or the destructor) must run before the DevicePool stops.
class PipelinePool {
 public:
  template <typename T>
  using Done = std::function<void(StatusOr<T>)>;

  // `metrics` may be null (no /metrics families for the pool and its requests).
  PipelinePool(ModelRepository repository, std::shared_ptr<const PipelineKinds> kinds,
               DevicePool& devices, ResidencyContext residency, MetricsRegistry* metrics,
               PoolOptions options = {});
  ~PipelinePool();
  PipelinePool(const PipelinePool&) = delete;
  PipelinePool& operator=(const PipelinePool&) = delete;

  // --- Pipelines ---
  // Loads `name` on `device` ("" or "auto": the manifest's placement and replica count), each
  // replica on its device's worker, after unloading the idle pipelines host memory needs gone
  // (Note [Host memory budget]). already_loaded when nothing was left to load.
  void Load(const std::string& name, const std::string& device, Done<LoadResult> done);
  // Unloads every replica of `name` with its leak check (Note [Leak check]). FailedPrecondition
  // with requests in flight.
  void Unload(const std::string& name, Done<UnloadResult> done);
  // Offload, onload or move every replica (or, with a device, the one replica) of `name`.
  void ChangeResidency(const std::string& name, ResidencyChange change, const std::string& device,
                       Done<ChangeResult> done);
  // Sets the offload policy of every replica of `name`; each goes to its resting residency.
  void SetPolicy(const std::string& name, const OffloadPolicy& policy, Done<PipelineStatus> done);

  // --- Requests ---
  // Runs one Generate call: waits for an on-demand load, resolves the request against the
  // pipeline's kind, routes it to a replica, batches it there (Note [Dynamic batching]), admits
  // it under the device's budget, runs it, retries it once elsewhere after running out of
  // memory. `listener` must stay valid until its OnReply.
  void Generate(GenerateCall call, GenerateListener* listener);
  // Runs one Encode call, the same way without batching.
  void Encode(EncodeCall call, EncodeListener* listener);
  // Counts a Generate or Encode call refused before it named a pipeline (its request did not
  // parse: Note [Requests that do not parse] in api/raw_call.h), with `status`.
  void CountRefused(RequestRpc rpc, const Status& status);

  // --- Reads ---
  // Every pipeline of the repository, loaded or not, sorted by name.
  std::vector<PipelineStatus> List();
  // Device memory, attributed bytes, loaded pipelines and the last `max_events` memory events.
  MemoryReport Memory(size_t max_events);
  // The memory event log (WatchMemory streams from it).
  MemoryEventLog& events() const { return *residency_.events; }
  // Releases the caching allocator's unused memory and records an empty_cache event per GPU;
  // `device` "" for every device. InvalidArgument for a device not served here.
  StatusOr<EmptyCacheResult> EmptyCache(const std::string& device);
  // The CUDA caching allocator's snapshot (PyTorch's memory visualizer opens it);
  // FailedPrecondition without CUDA.
  StatusOr<std::string> AllocatorSnapshot();

  // --- Life cycle (Note [Drain] in main.cpp) ---
  // Loads `names` ("all": every pipeline) one after the other and waits; failures are logged
  // and the pipelines show as failed, the others load.
  // `stop`, when given, is asked before each load: true skips the rest (a SIGTERM at start-up).
  void LoadAtStartup(const std::vector<std::string>& names,
                     const std::function<bool()>& stop = nullptr);
  // From now on new requests get Unavailable.
  void BeginDrain() { draining_ = true; }
  bool draining() const { return draining_.load(); }
  // Requests queued or running, every pipeline.
  int InFlight();
  // The load a balancer weighs the server by. Takes the registry's mutex briefly (as List does)
  // and reads each GPU's allocator statistics; cheap enough for a few calls a second.
  PoolLoad CurrentLoad();
  // Stops the idle offloader, then unloads every pipeline (each with its leak check) and waits.
  void UnloadAll();

 private:
  // Runs `step` on each device's worker in turn, then `done` with the first error or OK.
  void InTurn(std::vector<c10::Device> devices, DevicePool::Step step,
              std::function<void(const Status&)> done);
  // What a request's run needs of the pool.
  RequestContext Context();

  DevicePool& devices_;
  const ResidencyContext residency_;
  std::atomic<bool> draining_{false};
  std::unique_ptr<PipelineRegistry> registry_;
  std::unique_ptr<OnDemandLoader> loader_;  // on-demand loads and scale-outs
  const bool load_on_demand_;
  const double memory_budget_;  // PoolOptions::admission.memory_budget, for CurrentLoad
  std::unique_ptr<RequestMetrics> requests_;
  std::unique_ptr<PoolMetrics> metrics_;
  std::unique_ptr<IdleOffloader> idle_;
};

}  // namespace qpool
