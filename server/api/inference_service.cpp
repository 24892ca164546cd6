#include "api/inference_service.h"

#include <memory>

#include "api/generate_reactor.h"
#include "api/proto_convert.h"

namespace qpool::api {

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateReactor(registry_, *request);  // deletes itself in OnDone
}

grpc::ServerUnaryReactor* InferenceService::Encode(grpc::CallbackServerContext* context,
                                                   const v1::EncodeRequest* request,
                                                   v1::EncodeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto lease = registry_.Acquire(request->pipeline());
  if (!lease.ok()) {
    reactor->Finish(ToGrpc(lease.status()));
    return reactor;
  }
  Status valid = ValidateEncodePrompts(static_cast<size_t>(request->prompts_size()),
                                       (*lease)->pipeline().manifest());
  if (!valid.ok()) {
    reactor->Finish(ToGrpc(valid));
    return reactor;
  }
  std::vector<std::string> prompts(request->prompts().begin(), request->prompts().end());
  // The task owns the lease; request and response stay valid until Finish.
  std::shared_ptr<PipelineLease> shared(std::move(lease).value());
  DeviceWorker& worker = shared->worker();
  Status submitted = worker.Submit([reactor, response, shared, prompts](bool run) mutable {
    if (!run) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down"));
      return;
    }
    auto out = shared->pipeline().Encode(prompts);
    const std::string device = shared->pipeline().device().str();
    shared.reset();
    if (!out.ok()) {
      reactor->Finish(ToGrpc(out.status()));
      return;
    }
    ToProto(out->embeddings, response->mutable_embeddings());
    ToProto(out->input_ids, response->mutable_input_ids());
    response->set_device(device);
    reactor->Finish(grpc::Status::OK);
  });
  if (!submitted.ok()) reactor->Finish(ToGrpc(submitted));
  return reactor;
}

}  // namespace qpool::api
