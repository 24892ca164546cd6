// PipelineRegistry: which pipelines of the model repository are loaded, where, and how many
// requests each has in flight.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/model_repository.h"
#include "pipeline/sd_pipeline.h"
#include "pool/device_pool.h"
#include "residency/pipeline_residency.h"
#include "util/status.h"

namespace qpool {

enum class PipelineState { kAvailable, kLoading, kLoaded, kFailed };

struct ComponentStatus {
  std::string name;
  std::string device;
  std::string dtype;
  std::string quantization;
  ComponentBytes bytes;
  std::string residency;    // "unloaded", "host" or "device"
  uint64_t host_bytes = 0;  // host copy
};

// A snapshot for ListPipelines / GetMemoryReport.
struct PipelineStatus {
  std::string name;
  std::string kind;
  PipelineState state = PipelineState::kAvailable;
  std::string device;
  std::string error;
  uint32_t in_flight = 0;
  std::vector<ComponentStatus> components;
  GenerationDefaults defaults;
  OffloadPolicy policy;
};

struct LoadResult {
  PipelineStatus pipeline;
  double load_seconds = 0;
  bool already_loaded = false;
};

// Holds a loaded pipeline for one request; the pipeline cannot be unloaded while a lease lives.
class PipelineLease {
 public:
  PipelineLease(std::shared_ptr<SdPipeline> pipeline, std::shared_ptr<std::atomic<int>> in_flight,
                DeviceWorker* worker)
      : pipeline_(std::move(pipeline)), in_flight_(std::move(in_flight)), worker_(worker) {}
  // Drops its reference before it stops counting, so an unload that sees no request in flight
  // holds the last reference.
  ~PipelineLease() {
    pipeline_.reset();
    in_flight_->fetch_sub(1);
  }
  PipelineLease(const PipelineLease&) = delete;
  PipelineLease& operator=(const PipelineLease&) = delete;

  SdPipeline& pipeline() { return *pipeline_; }
  // The worker of the pipeline's device; requests run there.
  DeviceWorker& worker() { return *worker_; }

 private:
  std::shared_ptr<SdPipeline> pipeline_;
  std::shared_ptr<std::atomic<int>> in_flight_;
  DeviceWorker* worker_;
};

// What an unload freed and whether the device got it all back.
struct UnloadResult {
  uint64_t freed_bytes = 0;   // attributed bytes the pipeline held
  uint64_t leaked_bytes = 0;  // Note [Leak check]
};

// Note [Leak check]
// Unload drops every tensor of the pipeline and then compares, per device, the drop of the
// allocator's allocated bytes with what the pipeline's blocks held (as the allocator counted them
// when they were allocated). Unload runs on the device's worker, so nothing else allocates on
// that device meanwhile; a drop smaller than expected is a leak: an error log, a `leak` event and
// qpool_vram_leaked_bytes_total. The CPU is checked the same way against the host bytes of
// pipeline tensors (Note [Host memory accounting]).

// Thread safety: all public methods take the mutex; loading itself runs without it (the entry is
// marked kLoading meanwhile). Do not call a public method from another one.
class PipelineRegistry {
 public:
  PipelineRegistry(ModelRepository repository, DevicePool& devices, ResidencyContext residency);

  // Loads `name` on `device` ("" or "auto": the manifest's placement, then the pool's choice).
  // Blocks while loading; call it from a device worker or a thread of its own, not a gRPC thread.
  // OK with already_loaded when it is loaded (FailedPrecondition if `device` names another
  // device than the one it is on); FailedPrecondition while another load of it runs.
  StatusOr<LoadResult> Load(const std::string& name, const std::string& device);
  // Drops every tensor of `name` and checks that the memory came back (Note [Leak check]). Call
  // it on the pipeline's device worker. FailedPrecondition with requests in flight or when not
  // loaded; NotFound when the repository has no such pipeline.
  StatusOr<UnloadResult> Unload(const std::string& name);
  // The errors Unload would give now (an early answer before queueing it on the worker).
  Status CheckUnload(const std::string& name);

  // Admin residency changes; call them on the worker of the device they target (MoveTarget).
  // OFFLOAD: every component to the host. ONLOAD: back to `device` ("" = where it was).
  // MOVE: to `device`. FailedPrecondition when not loaded, for a CPU pipeline's offload, or (move
  // and onload elsewhere) with requests in flight; Unavailable while another change runs.
  enum class Change { kOffload, kOnload, kMove };
  StatusOr<std::pair<PipelineStatus, ResidencyReport>> ChangeResidency(const std::string& name,
                                                                       Change change,
                                                                       const std::string& device);
  // The device whose worker runs a change (the target, or the pipeline's device).
  StatusOr<c10::Device> ChangeTarget(const std::string& name, Change change,
                                     const std::string& device);
  // Sets the offload policy; the pipeline goes to its resting residency. Call it on the worker.
  StatusOr<PipelineStatus> SetPolicy(const std::string& name, const OffloadPolicy& policy);
  // Loaded pipelines whose idle policy wants an offload now.
  std::vector<std::string> IdleOffloadsDue();
  // Bytes attributed to loaded pipelines, per device string ("cpu" counts host copies).
  std::map<std::string, uint64_t> AttributedBytes();
  // Sum of every leak found by unload checks.
  uint64_t leaked_bytes_total() const { return leaked_total_.load(); }
  // Every pipeline of the repository, loaded or not, sorted by name.
  std::vector<PipelineStatus> List();
  // Loaded pipelines only.
  std::vector<PipelineStatus> ListLoaded();
  // A lease on a loaded pipeline. InvalidArgument for bad names, NotFound for unknown ones,
  // FailedPrecondition when it is not loaded.
  StatusOr<std::unique_ptr<PipelineLease>> Acquire(const std::string& name);
  // The device a Load of `name` would use, for routing the load onto that device's worker.
  StatusOr<c10::Device> PlanDevice(const std::string& name, const std::string& device);

 private:
  struct Entry {
    PipelineState state = PipelineState::kAvailable;
    std::string error;
    std::shared_ptr<SdPipeline> pipeline;
    std::shared_ptr<std::atomic<int>> in_flight = std::make_shared<std::atomic<int>>(0);
    bool changing = false;  // a residency change to another device runs
  };
  PipelineStatus StatusOf(const std::string& name, const Entry& entry) const;
  // The loaded entry or the error Acquire/Unload give.
  StatusOr<Entry*> LoadedEntry(const std::string& name);
  // The loaded entry if nothing runs on it (no request in flight, no move); mu_ held.
  StatusOr<Entry*> IdleEntry(const std::string& name);
  void RecordEvent(MemoryEventKind kind, const std::string& name, const c10::Device& device,
                   const DeviceMemoryStats& before, int64_t delta, double seconds,
                   const Status& status, uint64_t leaked = 0);

  const ModelRepository repository_;
  DevicePool& devices_;
  const ResidencyContext residency_;
  std::atomic<uint64_t> leaked_total_{0};
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

const char* PipelineStateName(PipelineState state);

}  // namespace qpool
