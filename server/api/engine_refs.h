// EngineRefs: the engine objects the gRPC services use.
#pragma once

#include <atomic>

#include "api/request_metrics.h"
#include "memory/device_memory.h"
#include "memory/memory_event_log.h"
#include "pool/device_pool.h"
#include "pool/pipeline_loader.h"
#include "pool/pipeline_registry.h"

namespace qpool::api {

// Borrowed pointers; all outlive the gRPC server.
struct EngineRefs {
  PipelineRegistry* registry = nullptr;
  DevicePool* devices = nullptr;
  const DeviceMemory* memory = nullptr;
  MemoryEventLog* events = nullptr;
  RequestMetrics* requests = nullptr;  // null: requests are not measured
  // Set when the server drains (Note [Drain] in main.cpp): new Generate and Encode calls get
  // UNAVAILABLE and WatchMemory streams end. Null: never drains.
  const std::atomic<bool>* draining = nullptr;
  // Loads pipelines that requests ask for (--load-on-demand). Null: such requests fail with
  // FAILED_PRECONDITION.
  OnDemandLoader* loader = nullptr;
};

}  // namespace qpool::api
