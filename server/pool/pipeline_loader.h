// LoadReplicas: the load of a pipeline's replicas, each on its device's worker, after the idle
// pipelines that host memory needs gone are unloaded (Note [Host memory budget]).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"
#include "util/status.h"

namespace qpool {

// Loads `name` on `devices` (PlanLoad's answer), one device's worker after the other, first
// unloading the idle pipelines PipelineRegistry::PlanHostRoom picks. `loaded` runs after each
// replica's load (on that worker), `done` once, with the first error or OK (on a worker, or on
// the caller's thread when nothing could be queued). `registry` and `pool` must outlive it.
void LoadReplicas(PipelineRegistry& registry, DevicePool& pool, const std::string& name,
                  std::vector<c10::Device> devices, std::function<void(const LoadResult&)> loaded,
                  std::function<void(const Status&)> done);

}  // namespace qpool
