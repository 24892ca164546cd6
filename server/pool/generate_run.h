// GenerateRun: the pool's side of one Generate call, from resolving the request to its reply.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "pool/batch_queue.h"
#include "pool/pool_request.h"
#include "pool/request_run.h"

namespace qpool {

// Note [Generate run lifetime]
// A run owns itself through shared pointers: the on-demand loader's callback and the replica's
// BatchQueue (Note [Dynamic batching]) hold it while it waits, the batch while it runs. Its
// listener hears OnReply exactly once, from Finish, after the lease has been released (so an
// unload right after the result is not refused) and the request recorded; the run never touches
// the listener again, and the batch never touches the run again once its Start returned false or
// its item's done ran (which finishes or retries elsewhere).
//
// Thread safety: Begin runs on the caller's thread; Start, Item and the item's callbacks on the
// replica's worker; the run's own hand-offs order them.
class GenerateRun final : public BatchMember, public std::enable_shared_from_this<GenerateRun> {
 public:
  // Starts a run of `call`; `listener` must stay valid until its OnReply.
  static void Begin(const RequestContext& context, GenerateCall call, GenerateListener* listener);

  GenerateRun(const RequestContext& context, GenerateCall call, GenerateListener* listener);

  // BatchMember
  const GenerateParams& params() const override { return params_; }
  Pipeline& pipeline() override { return run_.pipeline(); }
  bool Start(bool run, int batch_images) override;
  BatchItem Item(int batch_size, bool leader) override;

 private:
  // Resolves the request against its kind, acquires a replica and queues on its batch queue.
  Status Queue();
  // The item's done: the reply, or a retry elsewhere, or the error.
  void Done(StatusOr<GenerateOutput> output);
  // Releases the lease, records the request and tells the listener.
  void Finish(StatusOr<GenerateReply> reply);

  RequestRun run_;
  const GenerateCall call_;
  GenerateListener* const listener_;
  GenerateParams params_;
  // Of the current run, set by Start on the worker.
  int batch_images_ = 0;
  int steps_done_ = 0;
  std::chrono::steady_clock::time_point run_start_;
  std::string device_;
};

}  // namespace qpool
