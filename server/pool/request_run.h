// RequestRun: the pool's side of one Generate or Encode call: its lease on the replica the router
// picked, the hand-off to that replica's device worker, admission under the device's memory
// budget, one retry on another device after running out of memory, the working memory it teaches
// the pool, and its RequestRecorder.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "pool/batch_queue.h"
#include "pool/device_worker.h"
#include "pool/pipeline_registry.h"
#include "pool/request_context.h"
#include "pool/request_recorder.h"
#include "util/status.h"

namespace qpool {

// GenerateRun and EncodeRun own one and call, in order: Manifest, Acquire and Submit (Encode) or
// Dispatch (Generate) on the gRPC thread; Start, StepDone and End on the worker, then
// RetryElsewhere when the run ran out of memory; Release when it finishes the call (a refused or
// cancelled call still holds the lease), and Finish once the call has finished whichever way it
// ended. Thread safety: as RequestRecorder; the call's own hand-offs order the calls.
class RequestRun {
 public:
  // Starts the request's clock (RequestRecorder).
  RequestRun(const RequestContext& context, RequestRpc rpc);
  ~RequestRun() { SetRunning(false); }
  RequestRun(const RequestRun&) = delete;
  RequestRun& operator=(const RequestRun&) = delete;

  // The manifest of the loaded pipeline `name`, to resolve the request against; an error labels
  // the request as Acquire's would. Unavailable while the server drains.
  StatusOr<LoadedManifest> Manifest(const std::string& name);
  // Runs `queue`, the reactor's own resolution, Acquire and hand-off to the worker. When it fails
  // because Manifest found the pipeline not loaded and the server loads on demand, runs it again
  // once the pipeline is loaded (OnDemandLoader). `fail` gets the error that ends the call.
  void QueueWhenLoaded(const std::string& name, std::function<Status()> queue,
                       std::function<void(const Status&)> fail);
  // Leases the replica the pool routes the request to (PipelineRegistry::Acquire's errors).
  Status Acquire(const std::string& name, RouteOptions options);
  // The leased pipeline: valid from a successful Acquire until Release or End.
  Pipeline& pipeline() { return lease_->pipeline(); }
  // Queues `task` on the replica's worker; ResourceExhausted (queue full) or Unavailable
  // (stopping) otherwise, and then the lease is released.
  Status Submit(DeviceWorker::Task task);
  // Adds `member` to the batch queue of the replica and queues the queue's task on its worker
  // (Note [Dynamic batching]). Errors as Submit, unless a batch took the member meanwhile: then
  // OK, and that batch ends it.
  Status Dispatch(const std::shared_ptr<BatchMember>& member);
  // Releases the lease if still held.
  void Release() {
    SetRunning(false);
    lease_.reset();
  }

  // In the task: Unavailable when the worker dropped it at shutdown (`run` false; the lease is
  // released); ResourceExhausted when the device's memory budget cannot make room for the run,
  // `batch_images` images in all (0: the request's own; Note [Memory budget]); else OK, with the
  // run's start recorded (queue time, memory at the start).
  Status Start(bool run, int batch_images = 0);
  // One denoising step done (routing counts the steps a replica still has to run).
  void StepDone() { lease_->StepDone(); }
  // After the pipeline run that returned `status`: records its end, learns its working memory
  // (of `batch_images` images in all, 0: the request's own), drops the pipeline's CUDA graphs
  // if they no longer fit the memory budget (PipelineRegistry::FitGraphs) and releases the lease.
  void End(const Status& status, int batch_images = 0);
  // Counts the batch of `size` requests that this call led (Note [Dynamic batching]).
  void RecordBatch(int size) { recorder_.RecordBatch(size); }
  // After End (or a Start) that failed with ResourceExhausted, the device being short of memory:
  // leases a replica on another device and queues `task` (Encode) or dispatches `member`
  // (Generate) there, once per call. False when it did not (not an OOM, already retried, no other
  // replica, its queue full): the caller then finishes with `failure`.
  bool RetryElsewhere(const Status& failure, DeviceWorker::Task task);
  bool RetryElsewhere(const Status& failure, const std::shared_ptr<BatchMember>& member);

  // Seconds the request waited for the worker (after Start).
  double queue_seconds() const { return recorder_.queue_seconds(); }
  // Why the pool chose the device that ran it ("idle", "onload", "least-loaded", "retry-oom").
  const std::string& route() const { return route_; }
  // Runs started: 2 after a retry.
  int attempts() const { return attempts_; }

  // The call's gRPC deadline (none by default).
  void set_deadline(std::chrono::system_clock::time_point deadline) { deadline_ = deadline; }
  // Whether the deadline has passed.
  bool DeadlinePassed() const { return std::chrono::system_clock::now() >= deadline_; }
  // The status of a call that stopped because it was cancelled: DeadlineExceeded when its
  // deadline passed (gRPC cancels such calls too), else Cancelled; `where` says when it stopped.
  Status StoppedStatus(const std::string& where) const;

  // Records the call once, with the code it finished with.
  void Finish(StatusCode code) { recorder_.Finish(code); }

 private:
  // Counts the request as running (from a successful Start to End or Release) or not, once
  // each way (Note [Load signals] in pool/pool_metrics.h).
  void SetRunning(bool running);
  // RetryElsewhere: leases another device's replica, then `queue` hands the request to it.
  bool Reroute(const Status& failure, const std::function<Status()>& queue);

  PipelineRegistry& registry_;
  const std::atomic<bool>* draining_;
  OnDemandLoader* loader_;
  bool not_loaded_ = false;  // the last Manifest found the pipeline not loaded
  RequestMetrics* requests_;
  RequestRecorder recorder_;
  std::unique_ptr<PipelineLease> lease_;
  bool running_ = false;  // counted as running for name_ (SetRunning)
  std::string name_;
  RouteOptions options_;
  std::string route_;
  std::string last_device_;  // of the last Start
  int attempts_ = 0;
  std::chrono::system_clock::time_point deadline_ = std::chrono::system_clock::time_point::max();
};

}  // namespace qpool
