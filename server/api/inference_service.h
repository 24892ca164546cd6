// InferenceService: Generate (server-streaming) and Encode, on the gRPC callback API.
#pragma once

#include "pool/pipeline_registry.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Validates on the gRPC thread, then runs each request on its pipeline's device worker; no
// forward pass ever runs on a gRPC thread.
class InferenceService final : public v1::InferenceService::CallbackService {
 public:
  explicit InferenceService(PipelineRegistry& registry) : registry_(registry) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;

 private:
  PipelineRegistry& registry_;
};

}  // namespace qpool::api
