// GenerateReactor: one streaming Generate call: the request handed to the pool, its progress and
// result written to the client.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>

#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Note [Generate reactor lifetime]
// The reactor owns itself: it is deleted in OnDone, which gRPC calls only after Finish. Finish
// is called exactly once, with final_status_, after the pool's OnReply (PipelinePool::Generate
// calls it exactly once and never touches the listener afterwards), once every message queued
// before it has been written (OnWriteDone). The pool records the request (Note [Generate run
// lifetime] in pool/generate_run.h).
//
// Thread safety: OnProgress and OnReply come from a device worker (or, for a refused call, from
// the gRPC thread); Push/FinishAfterWrites take mu_; StartWrite/Finish are always called without
// mu_ held.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                              public GenerateListener {
 public:
  // Hands the request to `pool`; `deadline` is the call's (its context's deadline()).
  GenerateReactor(PipelinePool& pool, const v1::GenerateRequest& request,
                  std::chrono::system_clock::time_point deadline);

  // grpc::ServerWriteReactor
  void OnWriteDone(bool ok) override;
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

  // GenerateListener
  void OnProgress(int step, int total, double elapsed_seconds) override;
  bool Cancelled() const override { return cancelled_.load(); }
  void OnReply(StatusOr<GenerateReply> reply) override;

 private:
  void Push(v1::GenerateResponse message);
  // Finishes with `status` once every queued message is written.
  void FinishAfterWrites(grpc::Status status);

  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  // Serialized messages (Note [Requests that do not parse] in api/raw_call.h); the front is being
  // written while writing_.
  std::deque<grpc::ByteBuffer> pending_;
  bool writing_ = false;
  bool finish_requested_ = false;
  grpc::Status final_status_;
};

}  // namespace qpool::api
