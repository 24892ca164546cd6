// LoadReplicas: the load of a pipeline's replicas, each on its device's worker, after the idle
// pipelines that host memory needs gone are unloaded (Note [Host memory budget]).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"
#include "util/status.h"

namespace qpool {

// Loads `name` as `plan` (PlanLoad's answer) says, one device's worker after the other, first
// unloading the idle pipelines PipelineRegistry::PlanHostRoom picks. `loaded` runs after each
// replica's load (on that worker), `done` once, with the first error or OK (on a worker, or on
// the caller's thread when nothing could be queued). `registry` and `pool` must outlive it.
void LoadReplicas(PipelineRegistry& registry, DevicePool& pool, const std::string& name,
                  LoadPlan plan, std::function<void(const LoadResult&)> loaded,
                  std::function<void(const Status&)> done);

// Loads the pipelines requests ask for (--load-on-demand), and the replicas scale-outs ask for.
// The first request for a pipeline that is not loaded starts its load (PlanLoad with its manifest's
// placement, then LoadReplicas); requests arriving meanwhile wait for the same load. Thread safety:
// EnsureLoaded may be called from any thread.
class OnDemandLoader {
 public:
  // `registry` and `pool` must outlive the loader and every load it started.
  OnDemandLoader(PipelineRegistry& registry, DevicePool& pool);

  // Calls `then` once `name` is loaded: at once when it is, else when its load ends, with the
  // load's error if it failed (on a device worker, or on the caller's thread).
  void EnsureLoaded(const std::string& name, std::function<void(const Status&)> then);
  // A scale-out (PipelineRegistry::SetScaleOut): loads another replica of `name` on `device` in
  // the background, unloading nothing for host memory and nothing if the pipeline was unloaded
  // meanwhile; ends with EndScaleOut.
  void AddReplica(const std::string& name, const c10::Device& device);

 private:
  PipelineRegistry& registry_;
  DevicePool& pool_;
  std::mutex mu_;
  // Pipelines being loaded -> the callbacks waiting for them.
  std::map<std::string, std::vector<std::function<void(const Status&)>>> waiting_;
};

}  // namespace qpool
