#include "api/encode_reactor.h"

#include "api/proto_convert.h"

namespace qpool::api {

EncodeReactor::EncodeReactor(const EngineRefs& engine, const v1::EncodeRequest& request,
                             v1::EncodeResponse* response)
    : call_(engine, RequestRpc::kEncode), response_(response) {
  Status queued = Queue(request);
  if (!queued.ok()) Reply(ToGrpc(queued));
}

Status EncodeReactor::Queue(const v1::EncodeRequest& request) {
  RETURN_IF_ERROR(call_.Acquire(request.pipeline()));
  RETURN_IF_ERROR(ValidateEncodePrompts(static_cast<size_t>(request.prompts_size()),
                                        call_.pipeline().manifest()));
  prompts_.assign(request.prompts().begin(), request.prompts().end());
  return call_.Submit([this](bool run) { Run(run); });
}

void EncodeReactor::OnDone() {
  call_.Finish(code_);
  delete this;
}

void EncodeReactor::Reply(grpc::Status status) {
  call_.Release();  // usually released already; a refused call still holds it
  code_ = status.error_code();
  Finish(std::move(status));
}

void EncodeReactor::Run(bool run) {
  Status started = call_.Start(run);
  if (!started.ok()) {
    Reply(ToGrpc(started));
    return;
  }
  SdPipeline& pipeline = call_.pipeline();
  auto out = pipeline.Encode(prompts_);
  const std::string device = pipeline.device().str();
  call_.End(out.status());
  if (!out.ok()) {
    Reply(ToGrpc(out.status()));
    return;
  }
  ToProto(out->embeddings, response_->mutable_embeddings());
  ToProto(out->input_ids, response_->mutable_input_ids());
  response_->set_device(device);
  Reply(grpc::Status::OK);
}

}  // namespace qpool::api
