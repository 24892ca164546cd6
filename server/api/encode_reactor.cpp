#include "api/encode_reactor.h"

#include "api/proto_convert.h"

namespace qpool::api {

EncodeReactor::EncodeReactor(PipelinePool& pool, const v1::EncodeRequest& request,
                             v1::EncodeResponse* response,
                             std::chrono::system_clock::time_point deadline)
    : response_(response) {
  EncodeCall call;
  call.pipeline = request.pipeline();
  call.prompts.assign(request.prompts().begin(), request.prompts().end());
  call.deadline = deadline;
  pool.Encode(std::move(call), this);
}

void EncodeReactor::OnReply(StatusOr<EncodeReply> reply) {
  if (!reply.ok()) {
    Finish(ToGrpc(reply.status()));
    return;
  }
  ToProto(reply->output.embeddings, response_->mutable_embeddings());
  ToProto(reply->output.input_ids, response_->mutable_input_ids());
  if (reply->output.pooled.defined()) {
    ToProto(reply->output.pooled, response_->mutable_pooled_embeddings());
  }
  response_->set_device(reply->run.device);
  response_->set_route(reply->run.route);
  Finish(grpc::Status::OK);
}

}  // namespace qpool::api
