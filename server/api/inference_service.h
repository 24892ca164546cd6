// InferenceService: Generate (server-streaming) and Encode, on the gRPC callback API.
#pragma once

#include "api/access_control.h"
#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Validates on the gRPC thread, then runs each request on its pipeline's device worker; no
// forward pass ever runs on a gRPC thread. One reactor per call (generate_reactor.h,
// encode_reactor.h) hands it to the pool, which records it when it ends.
class InferenceService final : public v1::InferenceService::CallbackService {
 public:
  // `pool` and `access` outlive the service.
  InferenceService(PipelinePool& pool, const AccessControl& access)
      : pool_(pool), access_(access) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;

 private:
  PipelinePool& pool_;
  const AccessControl& access_;
};

}  // namespace qpool::api
