// GenerateReactor: one streaming Generate call, from validation to the last message.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "api/engine_refs.h"
#include "api/pipeline_call.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Note [Generate reactor lifetime]
// The reactor owns itself: it is deleted in OnDone, which gRPC calls only after Finish. Finish
// is called exactly once, with final_status_, either on the gRPC thread (request refused) or,
// after the worker queued the last message, from OnWriteDone once every message has been
// written. The worker reaches the reactor only through its Member, which the replica's
// BatchQueue holds (Note [Dynamic batching]); the worker task captures the queue, not the reactor,
// and the batch never touches a member again once its Start returned false or its item's done ran
// (which queues the final message or retries elsewhere). The
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
  class Member;

  // Resolves the request, acquires a replica and dispatches the Member to its batch queue.
  Status Queue(const v1::GenerateRequest& request);
  // BatchMember::Start and Item, on the worker.
  bool Start(bool run, int batch_images);
  BatchItem Item(int batch_size, bool leader);
  // The item's done: the result message, or a retry elsewhere, or the error.
  void Done(StatusOr<GenerateOutput> output);
  void Push(v1::GenerateResponse message);
  // Releases the lease and finishes with `status` once every queued message is written.
  void FinishAfterWrites(grpc::Status status);

  PipelineCall call_;
  GenerateParams params_;
  std::shared_ptr<Member> member_;
  std::atomic<bool> cancelled_{false};
  // Of the current run, set by Start on the worker.
  int batch_images_ = 0;
  int steps_done_ = 0;
  double queue_seconds_ = 0;
  std::chrono::steady_clock::time_point run_start_;
  std::string device_;

  std::mutex mu_;
  std::deque<v1::GenerateResponse> pending_;  // front is being written while writing_
  bool writing_ = false;
  bool finish_requested_ = false;
  grpc::Status final_status_;
};

}  // namespace qpool::api
