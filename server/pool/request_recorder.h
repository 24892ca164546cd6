// RequestRecorder: what one Generate or Encode call leaves behind: its request metrics, its
// device memory, and an `oom` memory event when it runs out of memory.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <optional>
#include <string>

#include "memory/device_memory.h"
#include "pool/request_context.h"
#include "pool/request_metrics.h"
#include "util/status.h"

namespace qpool {

// Note [Request memory]
// A device worker runs one task at a time, so from RunStarted to RunEnded only this request
// allocates on its device (the prefetches it queues on the copy stream included). RunStarted
// resets the allocator's peak, so the peak RunEnded reads is the request's own; its working
// memory is that peak minus what was allocated at RunStarted (the resident weights). Only CUDA
// devices are measured: the CPU's DeviceMemory counts pipeline tensors, not activations (Note
// [Host memory accounting]). Failed runs are not observed, since a cancelled or refused run
// would pull the histograms down; an out-of-memory failure becomes an `oom` memory event instead.
//
// A ResourceExhausted status from the run is always an allocation failure: the other
// ResourceExhausted of a request, a full queue, comes from DeviceWorker::Submit before any run.

// Times one request from its arrival (construction) and records it exactly once (Finish).
// Thread safety: none inside. The request's own hand-offs order the calls: SetPipeline on the
// gRPC thread before the task is queued, RunStarted/RunEnded in the task on the worker, Finish
// once the call has finished.
class RequestRecorder {
 public:
  // Starts the clock. `context.requests`, `context.memory` and `context.events` may be null, which
  // leaves out metrics, memory readings and events respectively.
  RequestRecorder(const RequestContext& context, RequestRpc rpc);

  // Sets the pipeline label from the name asked for and Acquire's answer for it
  // (RequestMetrics::PipelineLabel). Until then the label is RequestMetrics::kUnknownPipeline.
  void SetPipeline(const std::string& requested, const Status& acquired);
  // On the worker, when the request's task starts and before the pipeline runs on `device`:
  // observes the queue time, reads the device's memory and resets its peak.
  void RunStarted(const c10::Device& device);
  // Right after the pipeline run that returned `status` (Note [Request memory]).
  void RunEnded(const Status& status);
  // Observes the size of the batch this request led, on the device of its last RunStarted.
  void RecordBatch(int size);
  // Seconds since the request arrived.
  double seconds_since_arrival() const;
  // Seconds from arrival to the first RunStarted (0 before it).
  double queue_seconds() const { return queue_seconds_; }
  // Working memory of the last run if it succeeded on a GPU, else 0 (Note [Request memory]).
  uint64_t working_bytes() const { return working_bytes_; }
  // Counts the request with its final `code` and observes its duration. Only the first call
  // records.
  void Finish(StatusCode code);

 private:
  void AppendOomEvent(const Status& status, const DeviceMemoryStats& after);

  const RequestContext context_;
  const RequestRpc rpc_;
  const std::chrono::steady_clock::time_point arrived_;
  std::string pipeline_ = RequestMetrics::kUnknownPipeline;
  double queue_seconds_ = 0;
  std::chrono::steady_clock::time_point run_started_;
  std::optional<c10::Device> device_;  // set by RunStarted
  bool queued_recorded_ = false;       // a retried request waits twice; its queue time is the first
  uint64_t working_bytes_ = 0;
  DeviceMemoryStats at_start_;  // read by RunStarted, after the peak reset
  bool finished_ = false;
};

}  // namespace qpool
