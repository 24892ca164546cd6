// Router: which replica of a pipeline runs a request, as a pure function of a snapshot of the
// devices and the replicas (Note [Routing]). Torch-free, so it is unit-tested with made-up
// numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

// One device as the router sees it at one instant.
struct DeviceSnapshot {
  std::string device;            // "cpu", "cuda:0", ...
  uint64_t budget_bytes = 0;     // what qpool may use there; 0 = unlimited (the CPU)
  uint64_t used_bytes = 0;       // attributed to pipelines there; counts against the budget
  uint64_t evictable_bytes = 0;  // of used_bytes: idle replicas of other pipelines
  uint64_t free_bytes = 0;       // the driver's free memory (informational; 0 on the CPU)
  size_t queued = 0;             // tasks waiting or running on the device's worker
};

// One replica of the requested pipeline.
struct ReplicaSnapshot {
  int id = 0;                  // the caller's index, returned in the decision
  std::string device;
  bool resident = false;       // every component on its device: no onload before the run
  bool available = true;       // false while it is being moved, evicted or unloaded
  size_t in_flight = 0;        // its requests, queued or running
  uint64_t pending_steps = 0;  // denoising steps those requests still have to run
  uint64_t onload_bytes = 0;   // bytes to copy to the device before it can run
};

// The request being routed.
struct RouteRequest {
  uint64_t working_bytes = 0;        // estimated activation memory of its run
  std::vector<std::string> exclude;  // devices not to use: a retry after running out there
  // Scale-out: devices where the pipeline may add a replica (its placement allows them, it has
  // none there and none is loading; empty when it has placement.max_replicas already), each in
  // `devices` too, and what a replica takes there.
  std::vector<std::string> spare_devices;
  uint64_t replica_bytes = 0;
};

struct RouteDecision {
  int replica = -1;  // ReplicaSnapshot::id
  std::string device;
  // "idle" | "onload" | "least-loaded": stable, short, used in replies and as a metric label.
  std::string reason;
  uint64_t evict_bytes = 0;  // what the device must free (offload idle replicas) before the run
  // A spare device to load another replica on, in the background, because every replica was
  // busy; "" for none. The request itself runs on `device`.
  std::string scale_out;
};

// Note [Routing]
// Candidates are the available replicas on devices not excluded. A replica *fits* when what its
// run needs on its device (onload_bytes + working_bytes) is at most the budget's headroom
// (budget - used; unlimited with budget 0) plus what idle replicas of other pipelines there
// could give back (evictable); evict_bytes is what must go so that used + needed fits the
// budget (more than needed - headroom when the device is already over its budget). Among fitting
// replicas, in this order:
//   1. "idle": resident with nothing in flight, so it starts at once; the least queued device,
//      then the most headroom, then the lowest id;
//   2. "onload": not resident but idle; an onload from pinned memory at copy-engine speed
//      (bench/results/residency_onload_h200.json) costs far less than waiting for another
//      request's denoising loop; the most headroom first;
//   3. "least-loaded": every replica is busy; the fewest requests in flight, then the fewest
//      pending steps, then resident before not, then the most headroom, then the lowest id.
// Scale-out: when the decision is "least-loaded", `scale_out` names the spare device where a new
// replica (replica_bytes) plus this request's working memory fits the same way, the least queued,
// then the most headroom; the caller loads it in the background and later requests find it idle.
// Budgets are the check, not the driver's free memory: the caching allocator keeps freed blocks
// reserved, so "free" understates what qpool itself can reuse.
// Errors: no replicas -> FailedPrecondition; every replica unavailable -> Unavailable; every
// available one excluded -> ResourceExhausted (no other device has a replica); none fits ->
// ResourceExhausted naming the bytes needed and the best headroom.
StatusOr<RouteDecision> Route(const std::vector<DeviceSnapshot>& devices,
                              const std::vector<ReplicaSnapshot>& replicas,
                              const RouteRequest& request);

// Bytes as "1.50 GiB", "12.0 MiB", "512 B", for messages.
std::string FormatBytes(uint64_t bytes);

}  // namespace qpool
