// GenerateReactor: one streaming Generate call, from validation to the last message.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>

#include "api/engine_refs.h"
#include "api/pipeline_call.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Note [Generate reactor lifetime]
// The reactor owns itself: it is deleted in OnDone, which gRPC calls only after Finish. Finish
// is called exactly once, with final_status_, either on the gRPC thread (request refused) or,
// after the worker task queued the last message, from OnWriteDone once every message has been
// written. The worker task never touches the reactor after queueing its final message. The
// pipeline lease is released as soon as the pipeline work ends, so an unload right after the
// result is not refused. OnDone records the request with final_status_, so every path counts.
//
// Thread safety: Push/FinishAfterWrites take mu_ and may be called from the worker thread;
// StartWrite/Finish are always called without mu_ held.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // `engine.registry` must be set; the other members may be null (RequestRecorder).
  // `deadline` is the call's (its context's deadline()): past it, the request stops at the next
  // denoising step, or before it starts, with DEADLINE_EXCEEDED.
  GenerateReactor(const EngineRefs& engine, const v1::GenerateRequest& request,
                  std::chrono::system_clock::time_point deadline);

  void OnWriteDone(bool ok) override;
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override;

 private:
  // Acquires the pipeline, resolves the request and queues Run on the pipeline's worker.
  Status Queue(const v1::GenerateRequest& request);
  void Run(bool run);
  void Push(v1::GenerateResponse message);
  // Releases the lease and finishes with `status` once every queued message is written.
  void FinishAfterWrites(grpc::Status status);

  PipelineCall call_;
  GenerateParams params_;
  std::atomic<bool> cancelled_{false};

  std::mutex mu_;
  std::deque<v1::GenerateResponse> pending_;  // front is being written while writing_
  bool writing_ = false;
  bool finish_requested_ = false;
  grpc::Status final_status_;
};

}  // namespace qpool::api
