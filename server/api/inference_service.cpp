#include "api/inference_service.h"

#include "api/encode_reactor.h"
#include "api/generate_reactor.h"

namespace qpool::api {

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  grpc::Status allowed = access_.Check(*context, CallClass::kInference, "Generate");
  if (!allowed.ok()) return new FinishedWriter<v1::GenerateResponse>(std::move(allowed));
  return new GenerateReactor(pool_, *request, context->deadline());  // deletes itself in OnDone
}

grpc::ServerUnaryReactor* InferenceService::Encode(grpc::CallbackServerContext* context,
                                                   const v1::EncodeRequest* request,
                                                   v1::EncodeResponse* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kInference, "Encode");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  // Deletes itself in OnDone.
  return new EncodeReactor(pool_, *request, response, context->deadline());
}

}  // namespace qpool::api
