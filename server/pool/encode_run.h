// EncodeRun: the pool's side of one Encode call, from validating the prompts to its reply.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pool/pool_request.h"
#include "pool/request_run.h"

namespace qpool {

// Owns itself as GenerateRun does (Note [Generate run lifetime]): the loader's callback and the
// worker task hold it; its listener hears OnReply exactly once.
class EncodeRun final : public std::enable_shared_from_this<EncodeRun> {
 public:
  // Starts a run of `call`; `listener` must stay valid until its OnReply.
  static void Begin(const RequestContext& context, EncodeCall call, EncodeListener* listener);

  EncodeRun(const RequestContext& context, EncodeCall call, EncodeListener* listener);

 private:
  // Validates the prompts against the pipeline's kind, acquires a replica, queues Run on it.
  Status Queue();
  // The worker task.
  void Run(bool run);
  // Releases the lease, records the request and tells the listener.
  void Finish(StatusOr<EncodeReply> reply);

  RequestRun run_;
  const EncodeCall call_;
  EncodeListener* const listener_;
};

}  // namespace qpool
