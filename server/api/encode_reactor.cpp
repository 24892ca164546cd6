#include "api/encode_reactor.h"

#include "api/proto_convert.h"
#include "api/raw_call.h"

namespace qpool::api {

EncodeReactor::EncodeReactor(PipelinePool& pool, const v1::EncodeRequest& request,
                             grpc::ByteBuffer* raw_response,
                             std::chrono::system_clock::time_point deadline)
    : raw_response_(raw_response) {
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
  v1::EncodeResponse response;
  ToProto(reply->output.embeddings, response.mutable_embeddings());
  ToProto(reply->output.input_ids, response.mutable_input_ids());
  if (reply->output.pooled.defined()) {
    ToProto(reply->output.pooled, response.mutable_pooled_embeddings());
  }
  if (reply->output.llm_embeddings.defined()) {
    ToProto(reply->output.llm_embeddings, response.mutable_llm_embeddings());
    ToProto(reply->output.llm_input_ids, response.mutable_llm_input_ids());
  }
  response.set_device(reply->run.device);
  response.set_route(reply->run.route);
  *raw_response_ = SerializeRaw(response);
  Finish(grpc::Status::OK);
}

}  // namespace qpool::api
