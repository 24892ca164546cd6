// RequestContext: what the run of one request borrows from the pool.
#pragma once

#include <atomic>

#include "memory/device_memory.h"
#include "memory/memory_event_log.h"

namespace qpool {

class OnDemandLoader;
class PipelineRegistry;
class RequestMetrics;

// Borrowed pointers; all outlive every request. Only `registry` is required.
struct RequestContext {
  PipelineRegistry* registry = nullptr;
  // Set while the server drains (Note [Drain] in main.cpp): new requests get Unavailable.
  const std::atomic<bool>* draining = nullptr;
  // Loads the pipelines requests ask for (--load-on-demand); null: FailedPrecondition instead.
  OnDemandLoader* loader = nullptr;
  RequestMetrics* requests = nullptr;    // null: requests are not measured
  const DeviceMemory* memory = nullptr;  // null: no memory readings
  MemoryEventLog* events = nullptr;      // null: no oom events
};

}  // namespace qpool
