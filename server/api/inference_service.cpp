#include "api/inference_service.h"

#include "api/encode_reactor.h"
#include "api/generate_reactor.h"
#include "api/proto_convert.h"
#include "api/raw_call.h"

namespace qpool::api {

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  grpc::Status allowed = access_.Check(*context, CallClass::kInference, "Generate");
  if (!allowed.ok()) return new FinishedWriter(std::move(allowed));
  v1::GenerateRequest parsed;
  grpc::Status status = ParseRaw(*request, &parsed);
  if (!status.ok()) {
    pool_.CountRefused(RequestRpc::kGenerate, InvalidArgument(status.error_message()));
    return new FinishedWriter(std::move(status));
  }
  return new GenerateReactor(pool_, parsed, context->deadline());  // deletes itself in OnDone
}

grpc::ServerUnaryReactor* InferenceService::Encode(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kInference, "Encode");
  v1::EncodeRequest parsed;
  grpc::Status status = allowed.ok() ? ParseRaw(*request, &parsed) : allowed;
  StatusOr<c10::ScalarType> dtype = c10::kFloat;
  if (status.ok()) {
    dtype = EncodeReplyDtype(parsed.dtype());
    status = ToGrpc(dtype.status());
  }
  if (!status.ok()) {
    if (allowed.ok()) {
      pool_.CountRefused(RequestRpc::kEncode, InvalidArgument(status.error_message()));
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }
  // Deletes itself in OnDone.
  return new EncodeReactor(pool_, parsed, *dtype, response, context->deadline(),
                           max_message_bytes_);
}

}  // namespace qpool::api
