// InferenceService: Generate (server-streaming) and Encode, on the gRPC callback API.
#pragma once

#include "api/engine_refs.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Validates on the gRPC thread, then runs each request on its pipeline's device worker; no
// forward pass ever runs on a gRPC thread. One reactor per call (generate_reactor.h,
// encode_reactor.h) records the request when it ends.
class InferenceService final : public v1::InferenceService::CallbackService {
 public:
  // `engine.registry` must be set; requests, memory and events may be null (not recorded).
  explicit InferenceService(EngineRefs engine) : engine_(engine) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;

 private:
  const EngineRefs engine_;
};

}  // namespace qpool::api
