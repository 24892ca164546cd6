// PipelineCall: the engine side of one Generate or Encode call: its lease on the pipeline, the
// hand-off to the pipeline's device worker, and its RequestRecorder.
#pragma once

#include <grpcpp/support/status_code_enum.h>

#include <memory>
#include <string>

#include "api/engine_refs.h"
#include "api/request_recorder.h"
#include "pool/device_worker.h"
#include "pool/pipeline_registry.h"
#include "util/status.h"

namespace qpool::api {

// A reactor owns one and calls, in order: Acquire and Submit on the gRPC thread, Start and End in
// the task on the worker, Release when it finishes the call (a refused or cancelled call still
// holds the lease), and Finish once the call has finished (its OnDone), whichever way it ended.
// Thread safety: as RequestRecorder; the call's own hand-offs order the calls.
class PipelineCall {
 public:
  // Starts the request's clock (RequestRecorder). `engine.registry` must be set.
  PipelineCall(const EngineRefs& engine, RequestRpc rpc);

  // Leases the pipeline `name` (PipelineRegistry::Acquire's errors) and labels the request
  // from the answer.
  Status Acquire(const std::string& name);
  // The leased pipeline: valid from a successful Acquire until Release or End.
  SdPipeline& pipeline() { return lease_->pipeline(); }
  // Queues `task` on the pipeline's worker; ResourceExhausted (queue full) or Unavailable
  // (stopping) otherwise, and then the lease is released.
  Status Submit(DeviceWorker::Task task);
  // Releases the lease if still held.
  void Release() { lease_.reset(); }

  // In the task: Unavailable when the worker dropped it at shutdown (`run` false; the lease is
  // released), else OK, with the run's start recorded (queue time, memory at the start).
  Status Start(bool run);
  // After the pipeline run that returned `status`: records its end, releases the lease.
  void End(const Status& status);
  // Seconds the request waited for the worker (after Start).
  double queue_seconds() const { return recorder_.queue_seconds(); }

  // Records the call once, with the code it finished with.
  void Finish(grpc::StatusCode code) { recorder_.Finish(code); }

 private:
  PipelineRegistry& registry_;
  RequestRecorder recorder_;
  std::unique_ptr<PipelineLease> lease_;
};

}  // namespace qpool::api
