// InferenceService: Generate (server-streaming) and Encode, on the gRPC callback API.
#pragma once

#include "api/access_control.h"
#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Both RPCs registered raw (Note [Requests that do not parse] in api/raw_call.h).
using RawInferenceService = v1::InferenceService::WithRawCallbackMethod_Generate<
    v1::InferenceService::WithRawCallbackMethod_Encode<v1::InferenceService::Service>>;

// Checks access and parses on the gRPC thread, then runs each request on its pipeline's device
// worker; no forward pass ever runs on a gRPC thread. One reactor per call (generate_reactor.h,
// encode_reactor.h) hands it to the pool, which records it when it ends; a request that does not
// parse is counted here.
class InferenceService final : public RawInferenceService {
 public:
  // `pool` and `access` outlive the service; `max_message_bytes` is the server's bound on a
  // message (--max-message-mb), which an Encode reply must fit.
  InferenceService(PipelinePool& pool, const AccessControl& access, int max_message_bytes)
      : pool_(pool), access_(access), max_message_bytes_(max_message_bytes) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

 private:
  PipelinePool& pool_;
  const AccessControl& access_;
  const int max_message_bytes_;
};

}  // namespace qpool::api
