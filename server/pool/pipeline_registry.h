// PipelineRegistry: which pipelines of the model repository are loaded, their replicas (one
// copy per device), how many requests each has in flight, and the memory budget of each GPU.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "config/model_repository.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_kinds.h"
#include "pool/admission_options.h"
#include "pool/batch_queue.h"
#include "pool/device_pool.h"
#include "pool/pipeline_status.h"
#include "pool/router.h"
#include "pool/working_memory.h"
#include "residency/pipeline_residency.h"
#include "util/status.h"

namespace qpool {

// What a replica's requests are doing, shared by the registry and the leases.
struct ReplicaLoad {
  std::atomic<int> in_flight{0};          // requests queued or running
  std::atomic<int64_t> pending_steps{0};  // denoising steps they still have to run
  std::atomic<int64_t> last_used_ns{0};   // steady clock, for LRU eviction
};

// What Acquire needs to know about a request to route it.
struct RouteOptions {
  int width = 0;  // output size, for the working-memory estimate (0 = the defaults)
  int height = 0;
  int images = 1;
  int steps = 0;                     // denoising steps it will run (0 for Encode)
  std::vector<std::string> exclude;  // devices not to use: a retry after OOM there
};

// Holds one replica of a loaded pipeline for one request; the replica cannot be unloaded or moved
// while a lease lives.
class PipelineLease {
 public:
  PipelineLease(std::shared_ptr<Pipeline> pipeline, std::shared_ptr<ReplicaLoad> load,
                std::shared_ptr<BatchQueue> batches, DeviceWorker* worker, RouteDecision route,
                int steps);
  // Drops its reference before it stops counting, so an unload that sees no request in flight
  // holds the last reference.
  ~PipelineLease();
  PipelineLease(const PipelineLease&) = delete;
  PipelineLease& operator=(const PipelineLease&) = delete;

  Pipeline& pipeline() { return *pipeline_; }
  // The worker of the replica's device; the request runs there.
  DeviceWorker& worker() { return *worker_; }
  // The replica's Generate requests waiting for a batch (Note [Dynamic batching]).
  const std::shared_ptr<BatchQueue>& batches() const { return batches_; }
  // Which replica was chosen and why.
  const RouteDecision& route() const { return route_; }
  // One denoising step is done (the router's least-loaded estimate counts what is left).
  void StepDone();

 private:
  std::shared_ptr<Pipeline> pipeline_;
  std::shared_ptr<ReplicaLoad> load_;
  std::shared_ptr<BatchQueue> batches_;
  DeviceWorker* worker_;
  RouteDecision route_;
  int steps_left_;
};

// Counters the pool's metrics export (PoolMetrics).
struct PoolCounters {
  // (pipeline, device, reason) -> requests routed
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> routed;
  // (pipeline, device) -> replicas offloaded to make room
  std::map<std::pair<std::string, std::string>, uint64_t> evictions;
  // pipeline -> requests retried on another device after running out of memory
  std::map<std::string, uint64_t> retries;
  // pipeline -> requests queued or running, all replicas
  std::map<std::string, int> queued;
  // pipeline -> times it was unloaded to make room in host memory for another's load
  std::map<std::string, uint64_t> host_evictions;
  // (pipeline, device) -> replicas added there because every replica was busy
  std::map<std::pair<std::string, std::string>, uint64_t> scale_outs;
};

// A load's plan: the manifest, parsed once for the whole load, and the devices to load a replica
// on, each on its own worker.
struct LoadPlan {
  // The manifest, or why it cannot be used: a broken manifest still "loads" (on the CPU's
  // worker) so that Load records its error for ListPipelines.
  StatusOr<std::shared_ptr<const PipelineManifest>> manifest = Internal("no manifest");
  std::vector<c10::Device> devices;  // empty: loaded already where it was asked for
};

// A loaded pipeline's manifest and kind, to resolve a request against before Acquire.
struct LoadedManifest {
  std::shared_ptr<const PipelineManifest> manifest;
  const PipelineKind* kind = nullptr;
};

// Idle pipelines a load must unload first, each marked as unloading (as BeginUnload does) with
// the devices of its replicas; EndUnload each once done.
using HostEvictionPlan = std::vector<std::pair<std::string, std::vector<c10::Device>>>;

// Note [Host memory budget]
// Every replica keeps pinned host copies of its components, and a CPU replica computes from host
// memory, so each load takes about its component files' bytes of host memory, for as long as it
// stays loaded (offloading a replica does not give them back). --host-memory-budget bounds what
// qpool attributes to host memory, all devices together. A load that would go over it first
// unloads idle pipelines (every replica of each, nothing in flight), least recently used first,
// each on its own devices' workers before the load starts (PlanHostRoom, LoadReplicas); if even
// all idle pipelines are not enough, the load fails with RESOURCE_EXHAUSTED naming the bytes
// needed and free. The estimate is made before loading, from the component files, once per
// replica to load: exact for float32 files on the CPU, an upper bound when the replica's dtype
// is narrower (fp16 on a GPU) or quantization at load time shrinks them.
//
// Note [Memory budget]
// Each GPU has a budget, --memory-budget of its total memory. What counts against it is what qpool
// attributes to pipelines there plus the working memory of the request that is about to run
// (one at a time per device). Acquire routes with a snapshot of it (router.h); the worker checks
// it again right before the run (Admit) and before a load, when nothing else runs on the device.
// When it does not fit, idle replicas of other pipelines on that device are offloaded to pinned
// host memory, least recently used first; if even that is not enough, RESOURCE_EXHAUSTED says
// what was needed and what the budget had. The working memory of a request is learned per
// pipeline from the peaks measured on the GPU (WorkingMemoryModel). CUDA graphs a request
// captures (Note [Forward graphs] in component/graph_cache.h) stay with its pipeline and count
// against the budget from then on; when they do not fit, the request drops them as it ends
// (FitGraphs): graphs are a cache, worth less than another pipeline's weights.

// Note [Warm-up at load]
// A replica's first request pays for what no later one does: the first use of cuDNN and cuBLAS
// at each shape, the first call of every TorchScript graph and compiled package, and the
// denoiser's graph warm-up and capture at its size (Note [Forward graphs] in
// component/graph_cache.h), so an SD 1.5 image's first request takes several times as long as
// the next ones. With execution.warmup, Load makes one image on the new
// replica, on its worker, before the replica is registered, so no request reaches it first: the
// defaults' size, scheduler and guidance, kWarmupSteps steps (the denoiser's first forward warms
// up, the second is captured), seed 0, kWarmupPrompt. It is no request: request metrics do not
// count it and its image is dropped; component forwards do count it. A GPU load that rests on the
// device makes room for the component files plus one default image's working memory; a load
// that rests on the host (model, sequential) onloads for the warm-up as a request would, without
// the request's admission. The load's time includes the warm-up. A warm-up that fails fails the
// load with its code and message (the defaults' request would fail the same way), and the
// pipeline is dropped with all its memory.
inline constexpr int kWarmupSteps = 2;
inline constexpr char kWarmupPrompt[] = "a photograph of a mountain lake at dawn";

// Thread safety: all public methods take the mutex; loading, unloading and moving run without it
// (the replica is marked meanwhile). Do not call a public method from another one.
class PipelineRegistry {
 public:
  PipelineRegistry(ModelRepository repository, std::shared_ptr<const PipelineKinds> kinds,
                   DevicePool& devices, ResidencyContext residency,
                   AdmissionOptions admission = {});

  // A load of `name` on `device`: "" or "auto" takes the manifest's placement and replica
  // count, less the devices that have one already (no device when loaded); else that device (none
  // when a replica is there). Parses the manifest once for the whole load.
  StatusOr<LoadPlan> PlanLoad(const std::string& name, const std::string& device);
  // The idle pipelines to unload before loading `replicas` replicas of `manifest` (Note [Host
  // memory budget]), least recently used first, already marked as unloading; empty when it fits
  // or without a budget. ResourceExhausted when even every idle pipeline is not enough.
  // With `evict` false nothing is unloaded: ResourceExhausted unless it fits as it is.
  StatusOr<HostEvictionPlan> PlanHostRoom(const PipelineManifest& manifest, size_t replicas,
                                          bool evict = true);
  // Loads one replica of `name` from `manifest` (PlanLoad's; its error is recorded as the load's)
  // on `device`, making room under the budget first. Call it on `device`'s worker. already_loaded
  // when a replica is there; FailedPrecondition while another load of it on that device runs;
  // ResourceExhausted when it cannot fit.
  StatusOr<LoadResult> Load(const std::string& name,
                            const StatusOr<std::shared_ptr<const PipelineManifest>>& manifest,
                            const c10::Device& device);
  // The devices of `name`'s replicas, marking them all as unloading so that no request is
  // routed to them (FailedPrecondition with requests in flight, NotFound, not loaded...). Then
  // Unload each on its worker; EndUnload clears the marks of replicas left (after an error).
  StatusOr<std::vector<c10::Device>> BeginUnload(const std::string& name);
  void EndUnload(const std::string& name);
  // Drops every tensor of the replica on `device` and checks that the memory came back (Note
  // [Leak check] in memory/leak_check.h). Call it on that device's worker.
  StatusOr<UnloadResult> Unload(const std::string& name, const c10::Device& device);

  // Which replica goes where: (replica's device, target). Every replica for OFFLOAD and ONLOAD
  // without a device; an explicit device needs a pipeline with one replica (FailedPrecondition)
  // and no other replica on the target. Run each change on the target's worker.
  StatusOr<std::vector<std::pair<c10::Device, c10::Device>>> PlanChange(const std::string& name,
                                                                        ResidencyChange change,
                                                                        const std::string& device);
  // One replica's change from PlanChange. FailedPrecondition when not loaded, for a CPU
  // pipeline's offload, or (move and onload elsewhere) with requests in flight; Unavailable
  // while another change of it runs.
  StatusOr<ResidencyReport> ChangeResidency(const std::string& name, const c10::Device& replica,
                                            ResidencyChange change, const c10::Device& target);
  // Sets the offload policy of the replica on `device`; it goes to its resting residency. Call
  // it on that device's worker.
  Status SetPolicy(const std::string& name, const c10::Device& device, const OffloadPolicy& policy);

  // A lease on the replica the router picks for a request (router.h). InvalidArgument for bad
  // names, NotFound for unknown ones, FailedPrecondition when not loaded, ResourceExhausted when
  // the pipeline's queue is full or no replica's device can fit it, Unavailable while every
  // replica is being moved.
  StatusOr<std::unique_ptr<PipelineLease>> Acquire(const std::string& name,
                                                   const RouteOptions& options);
  // How a scale-out (Note [Routing]) gets its replica loaded: `load(name, device)` is called,
  // without the registry's mutex, when Acquire found every replica busy and the manifest's
  // placement.max_replicas allows another one where it fits; EndScaleOut(name) once that load
  // ended, whichever way. One scale-out per pipeline at a time. Unset: no scale-out.
  void SetScaleOut(std::function<void(const std::string&, const c10::Device&)> load);
  void EndScaleOut(const std::string& name);
  // The manifest and kind of a loaded pipeline (its replicas share them), for resolving a request
  // before Acquire. Errors as Acquire.
  StatusOr<LoadedManifest> Manifest(const std::string& name);
  // On the worker, right before the leased request runs: makes room under the budget (Note
  // [Memory budget]). ResourceExhausted when it cannot.
  Status Admit(PipelineLease& lease, const RouteOptions& options);
  // On the worker, as a leased request ends: when the pipelines on its GPU now hold more than the
  // budget, the pipeline's CUDA graphs go (Note [Memory budget]).
  void FitGraphs(PipelineLease& lease);
  // A successful request on a GPU needed `bytes` of working memory (Note [Request memory]).
  void ObserveWorkingMemory(const std::string& name, const RouteOptions& options, uint64_t bytes);

  // (pipeline, replica device) of replicas whose idle policy wants an offload now.
  std::vector<std::pair<std::string, c10::Device>> IdleOffloadsDue();
  // Bytes attributed to loaded pipelines, per device string ("cpu" counts host copies).
  std::map<std::string, uint64_t> AttributedBytes();
  // Sum of every leak found by unload checks.
  uint64_t leaked_bytes_total() const { return leaked_total_.load(); }
  // Every pipeline of the repository, loaded or not, sorted by name.
  std::vector<PipelineStatus> List();
  // The names of the repository's pipelines, sorted.
  std::vector<std::string> RepositoryNames() const { return repository_.ListNames(); }
  // Loaded pipelines only.
  std::vector<PipelineStatus> ListLoaded();
  // The status of `name` if it is loaded.
  std::optional<PipelineStatus> LoadedStatus(const std::string& name);
  // Routing, eviction and queue counters.
  PoolCounters Counters();

 private:
  struct Replica {
    std::shared_ptr<Pipeline> pipeline;
    std::shared_ptr<ReplicaLoad> load = std::make_shared<ReplicaLoad>();
    std::shared_ptr<BatchQueue> batches;
    bool changing = false;  // being moved, evicted or unloaded: nothing is routed to it
  };
  struct Entry {
    std::string error;                                 // of the last failed load
    std::vector<Replica> replicas;                     // loaded copies, one per device
    std::set<std::string> loading;                     // devices with a replica being loaded
    bool unloading = false;                            // BeginUnload..EndUnload
    std::shared_ptr<const PipelineManifest> manifest;  // of the loaded replicas
    const PipelineKind* kind = nullptr;                // of the loaded replicas
    std::shared_ptr<WorkingMemoryModel> working;       // learned per pipeline
    bool scaling_out = false;    // a scale-out load was asked for and has not ended
    uint64_t replica_bytes = 0;  // ComponentFileBytes of the manifest (scale-out's estimate)
  };
  PipelineStatus StatusOf(const std::string& name, const Entry& entry) const;
  // What a replica of `manifest` takes in host memory, about: its component files' bytes.
  static uint64_t ComponentFileBytes(const PipelineManifest& manifest);
  // Marks every replica of an idle `entry` as unloading and returns their devices:
  // BeginUnload's work, its errors; mu_ held.
  StatusOr<std::vector<c10::Device>> MarkUnloading(const std::string& name, Entry& entry);
  // Acquire under mu_; sets `scale_out` to a device to add a replica on, or leaves it.
  StatusOr<std::unique_ptr<PipelineLease>> AcquireLocked(const std::string& name,
                                                         const RouteOptions& options,
                                                         std::optional<c10::Device>* scale_out);
  // The loaded entry or the error Acquire/Unload give; mu_ held.
  StatusOr<Entry*> LoadedEntry(const std::string& name);
  // The replica of `entry` on `device`, or nullptr; mu_ held.
  static Replica* FindReplica(Entry& entry, const c10::Device& device);
  // Budget, use and evictable bytes of `device`, with `except`'s replicas not evictable; mu_ held.
  DeviceSnapshot SnapshotOf(const c10::Device& device, const std::string& except);
  // Offloads idle replicas of other pipelines on `device`, LRU first, until `needed` bytes fit
  // in the budget. `what` names the need in the error. Call it on `device`'s worker without mu_.
  Status MakeRoom(const c10::Device& device, uint64_t needed, const std::string& except,
                  const std::string& what);
  void RecordEvent(MemoryEventKind kind, const std::string& name, const c10::Device& device,
                   const DeviceMemoryStats& before, int64_t delta, double seconds,
                   const Status& status, uint64_t leaked = 0);
  // The working memory model a new pipeline of `kind` starts with.
  std::shared_ptr<WorkingMemoryModel> NewWorkingModel(const PipelineKind& kind) const;

  const ModelRepository repository_;
  const std::shared_ptr<const PipelineKinds> kinds_;
  DevicePool& devices_;
  const ResidencyContext residency_;
  const AdmissionOptions admission_;
  std::atomic<uint64_t> leaked_total_{0};
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
  PoolCounters counters_;  // `queued` is filled in by Counters()
  std::function<void(const std::string&, const c10::Device&)> scale_out_;  // SetScaleOut
};

}  // namespace qpool
