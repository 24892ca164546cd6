#include "api/encode_reactor.h"

#include "api/proto_convert.h"

namespace qpool::api {

EncodeReactor::EncodeReactor(const EngineRefs& engine, const v1::EncodeRequest& request,
                             v1::EncodeResponse* response,
                             std::chrono::system_clock::time_point deadline)
    : call_(engine, RequestRpc::kEncode), response_(response) {
  call_.set_deadline(deadline);
  call_.QueueWhenLoaded(
      request.pipeline(), [this, request] { return Queue(request); },
      [this](const Status& status) { Reply(ToGrpc(status)); });
}

Status EncodeReactor::Queue(const v1::EncodeRequest& request) {
  ASSIGN_OR_RETURN(auto manifest, call_.Manifest(request.pipeline()));
  RETURN_IF_ERROR(ValidateEncodePrompts(static_cast<size_t>(request.prompts_size()), *manifest));
  RETURN_IF_ERROR(call_.Acquire(request.pipeline(), RouteOptions{}));
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
  if (!started.ok() && call_.RetryElsewhere(started, [this](bool run) { Run(run); })) return;
  if (!started.ok()) {
    Reply(ToGrpc(started));
    return;
  }
  if (call_.DeadlinePassed()) {
    Reply(ToGrpc(
        call_.StoppedStatus(StrCat("while it waited ", call_.queue_seconds(), " s in the queue"))));
    return;
  }
  SdPipeline& pipeline = call_.pipeline();
  auto out = pipeline.Encode(prompts_);
  const std::string device = pipeline.device().str();
  call_.End(out.status());
  if (!out.ok() && call_.RetryElsewhere(out.status(), [this](bool run) { Run(run); })) return;
  if (!out.ok()) {
    Reply(ToGrpc(out.status()));
    return;
  }
  ToProto(out->embeddings, response_->mutable_embeddings());
  ToProto(out->input_ids, response_->mutable_input_ids());
  response_->set_device(device);
  response_->set_route(call_.route());
  Reply(grpc::Status::OK);
}

}  // namespace qpool::api
