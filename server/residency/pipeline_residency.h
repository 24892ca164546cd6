// PipelineResidency: applies a pipeline's offload policy around each component it runs, and
// performs the admin moves (offload, onload, move) of the whole pipeline, all or nothing.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/offload_policy.h"
#include "memory/device_memory.h"
#include "memory/memory_event_log.h"
#include "residency/component_residency.h"

namespace qpool {

// What the residency layer needs from the rest of the server; all outlive the pipelines.
struct ResidencyContext {
  ArenaAllocator* arenas = nullptr;
  BlockCopier* copier = nullptr;
  const DeviceMemory* memory = nullptr;  // counters for events; null: events without counters
  MemoryEventLog* events = nullptr;      // null: no events
};

// What a pipeline-wide change did.
struct ResidencyReport {
  std::vector<ComponentMove> moves;  // components that moved
  uint64_t bytes = 0;
  double seconds = 0;
};

// One component's residency, for snapshots.
struct ComponentPlace {
  std::string name;
  Residency state = Residency::kUnloaded;
  c10::Device device{c10::kCPU};
  uint64_t host_bytes = 0;
};

// Thread safety: device(), policy(), Snapshot() and idle_for() may be called from any thread.
// Every other method must be called by one thread at a time: the device worker that runs the
// pipeline (requests and admin moves are tasks on it); callers keep requests away during a move
// to another device.
// Where a Place spent its time: packing the components into host blocks (with any dtype
// conversion) and copying them to the device (Note [Load stages] in pipeline/load_stages.h); a
// load straight to the GPU packs into the device blocks, all of it `device`.
struct PlaceSeconds {
  double pack = 0;
  double device = 0;
};

class PipelineResidency {
 public:
  PipelineResidency(std::string pipeline, std::vector<Component*> components,
                    ResidencyContext context, OffloadPolicy policy);
  ~PipelineResidency();

  // Load: host copies in `dtype` (pinned when `device` is a GPU and the policy offloads), then
  // the policy's resting residency on `device`; under `none` on a GPU, straight into device
  // blocks with no host copy (Note [Loads straight to the GPU]). All or nothing.
  Status Place(const c10::Device& device, c10::ScalarType dtype);
  // Place with each component's own dtype (one per component, in order); `seconds`, when given,
  // gets the time of each stage.
  Status Place(const c10::Device& device, const std::vector<c10::ScalarType>& dtypes,
               PlaceSeconds* seconds = nullptr);

  // The device the pipeline computes on.
  c10::Device device() const;
  OffloadPolicy policy() const;
  // Takes effect at once: the pipeline goes to the new policy's resting residency.
  Status SetPolicy(OffloadPolicy policy);

  // --- Request hooks (Note [Offload policies]) ---
  // Start of a request (RequestResidencyScope calls it).
  void BeginRequest();
  // Makes `component` resident on the device before it runs (waits for its prefetch on the GPU,
  // not on the host).
  Status Use(Component& component);
  // Starts copying `component` to the device if the policy offloads (model); errors surface in
  // the Use() that follows.
  void Prefetch(Component& component);
  // `component` will not run again in this request: under `model` it goes back to the host.
  void Done(Component& component);
  // End of a request, whatever happened: the policy's resting residency. Errors are logged and
  // recorded as events; they do not change the request's outcome.
  void Settle();

  // --- Admin ---
  // Every component to the host. FailedPrecondition when it is on the CPU (nothing to offload).
  StatusOr<ResidencyReport> Offload();
  // Every component to `device` (the pipeline's device when empty).
  StatusOr<ResidencyReport> Onload(const c10::Device& device);
  // Every component to `device`, which becomes the pipeline's device. Also used by Onload.
  StatusOr<ResidencyReport> MoveTo(const c10::Device& device);
  // Drops every tensor.
  void Unload();

  // Device bytes a request needs for the pipeline's components beyond what is resident now:
  // the components not on the device, or under the sequential policy the groups a streamed
  // component holds at most (prefetch + 2 of its largest groups, plus resident_mib).
  uint64_t BytesToRun() const;

  std::vector<ComponentPlace> Snapshot() const;
  // Every block the components hold (weakly), for the unload leak check.
  std::vector<ComponentResidency::BlockRef> Blocks() const;
  // Attributed bytes per device string; "cpu" counts host copies.
  std::map<std::string, uint64_t> BytesByDevice() const;
  // Seconds since the last request ended (0 while one runs).
  double idle_for() const;
  // Whether the idle policy wants an offload now.
  bool IdleOffloadDue() const;

 private:
  ComponentResidency& of(const Component& component);
  // Place under `none` on a GPU: every component straight into its device block.
  Status PlaceOnDevice(const c10::Device& device, const std::vector<c10::ScalarType>& dtypes,
                       PlaceSeconds* seconds);
  // Stages every component for `to`, then commits them all; records one event per component.
  StatusOr<ResidencyReport> MoveAll(Residency to, const c10::Device& device, MemoryEventKind kind);
  StatusOr<ComponentMove> MoveOne(ComponentResidency& c, Residency to, const c10::Device& device,
                                  bool wait, MemoryEventKind kind);
  // host -> streaming for a component of a sequential pipeline (`warm`: start its first copies).
  Status BeginStreaming(ComponentResidency& c, bool warm);
  // streaming -> host, with its stream event.
  void EndStreaming(ComponentResidency& c);
  void Record(MemoryEventKind kind, const std::string& component, const c10::Device& device,
              const DeviceMemoryStats& before, int64_t delta, double seconds, const Status& status,
              const std::string& from, const std::string& to, const std::string& message = "",
              uint64_t copied_bytes = 0);
  DeviceMemoryStats Counters(const c10::Device& device) const;

  const std::string pipeline_;
  const ResidencyContext context_;
  std::vector<std::unique_ptr<ComponentResidency>> components_;
  // Counters and time when each streaming component began (the worker's only).
  std::map<const ComponentResidency*,
           std::pair<DeviceMemoryStats, std::chrono::steady_clock::time_point>>
      stream_started_;
  mutable std::mutex mu_;  // guards the fields below
  c10::Device device_{c10::kCPU};
  OffloadPolicy policy_;
  bool in_request_ = false;
  bool streamable_ = false;  // planned for streaming at load (policy sequential)  // counters and
                             // time when each streaming component began
  std::chrono::steady_clock::time_point last_used_ = std::chrono::steady_clock::now();
};

// Calls Settle() when a request scope ends, however it ends.
class RequestResidencyScope {
 public:
  explicit RequestResidencyScope(PipelineResidency& residency);
  ~RequestResidencyScope();
  RequestResidencyScope(const RequestResidencyScope&) = delete;
  RequestResidencyScope& operator=(const RequestResidencyScope&) = delete;

 private:
  PipelineResidency& residency_;
};

}  // namespace qpool
