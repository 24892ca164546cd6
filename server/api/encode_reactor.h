// EncodeReactor: one unary Encode call, from validation to its reply.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "api/engine_refs.h"
#include "api/pipeline_call.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Owns itself like GenerateReactor (Note [Generate reactor lifetime]): Reply is called exactly
// once, on the gRPC thread when the request is refused or from the worker task, which touches
// nothing of the reactor afterwards; OnDone records the request and deletes the reactor.
class EncodeReactor final : public grpc::ServerUnaryReactor {
 public:
  // `engine.registry` must be set; the other members may be null (RequestRecorder). `response`
  // is gRPC's and stays valid until OnDone.
  // Past `deadline` (the call's), a request that has not started gets DEADLINE_EXCEEDED.
  EncodeReactor(const EngineRefs& engine, const v1::EncodeRequest& request,
                v1::EncodeResponse* response, std::chrono::system_clock::time_point deadline);

  void OnDone() override;

 private:
  // Acquires the pipeline, checks the prompts and queues Run on the pipeline's worker.
  Status Queue(const v1::EncodeRequest& request);
  void Run(bool run);
  // Releases the lease and finishes the call with `status`, remembering its code for OnDone.
  void Reply(grpc::Status status);

  PipelineCall call_;
  v1::EncodeResponse* const response_;
  std::vector<std::string> prompts_;
  grpc::StatusCode code_ = grpc::StatusCode::OK;
};

}  // namespace qpool::api
