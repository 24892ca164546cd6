#include "api/encode_reactor.h"

#include <algorithm>

#include "api/proto_convert.h"
#include "api/raw_call.h"

namespace qpool::api {

EncodeReactor::EncodeReactor(PipelinePool& pool, const v1::EncodeRequest& request,
                             c10::ScalarType dtype, grpc::ByteBuffer* raw_response,
                             std::chrono::system_clock::time_point deadline, int max_message_bytes)
    : raw_response_(raw_response),
      max_message_bytes_(max_message_bytes),
      prompts_(request.prompts_size()),
      dtype_(dtype) {
  EncodeCall call;
  call.pipeline = request.pipeline();
  call.prompts.assign(request.prompts().begin(), request.prompts().end());
  call.deadline = deadline;
  pool.Encode(std::move(call), this);
}

Status CheckReplySize(size_t bytes, int prompts, int max_message_bytes, bool float32) {
  if (bytes <= static_cast<size_t>(max_message_bytes)) return Status::Ok();
  constexpr size_t kMiB = 1 << 20;
  const auto ceil_mib = [](size_t b) { return (b + kMiB - 1) / kMiB; };
  const size_t each = bytes / static_cast<size_t>(std::max(prompts, 1));
  return ResourceExhausted(StrCat(
      "the Encode reply is ", ceil_mib(bytes), " MiB for ", prompts, " prompt(s), about ",
      ceil_mib(each), " MiB each, above the server's message limit of ", max_message_bytes >> 20,
      " MiB: ", prompts > 1 ? "send fewer prompts per request, " : "",
      float32 ? "ask for dtype DTYPE_BFLOAT16 (half the bytes), " : "",
      prompts > 1 || float32 ? "or " : "", "start the server with --max-message-mb ",
      ceil_mib(bytes), " or more"));
}

StatusOr<c10::ScalarType> EncodeReplyDtype(int dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT32:
      return c10::kFloat;
    case v1::DTYPE_BFLOAT16:
      return c10::kBFloat16;
    case v1::DTYPE_FLOAT16:
      return c10::kHalf;
    default:
      break;
  }
  const std::string name =
      v1::DType_IsValid(dtype) ? v1::DType_Name(static_cast<v1::DType>(dtype)) : StrCat(dtype);
  return InvalidArgument(StrCat("field 'dtype' is ", name,
                                "; Encode returns DTYPE_FLOAT32 (the default), DTYPE_BFLOAT16 or "
                                "DTYPE_FLOAT16 embeddings"));
}

void EncodeReactor::OnReply(StatusOr<EncodeReply> reply) {
  if (!reply.ok()) {
    Finish(ToGrpc(reply.status()));
    return;
  }
  v1::EncodeResponse response;
  const auto floating = [this](const torch::Tensor& t) {
    return t.is_floating_point() ? t.to(dtype_) : t;
  };
  ToProto(floating(reply->output.embeddings), response.mutable_embeddings());
  ToProto(reply->output.input_ids, response.mutable_input_ids());
  if (reply->output.pooled.defined()) {
    ToProto(floating(reply->output.pooled), response.mutable_pooled_embeddings());
  }
  if (reply->output.llm_embeddings.defined()) {
    ToProto(floating(reply->output.llm_embeddings), response.mutable_llm_embeddings());
    ToProto(reply->output.llm_input_ids, response.mutable_llm_input_ids());
  }
  response.set_device(reply->run.device);
  response.set_route(reply->run.route);
  const Status fits =
      CheckReplySize(response.ByteSizeLong(), prompts_, max_message_bytes_, dtype_ == c10::kFloat);
  if (!fits.ok()) {
    Finish(ToGrpc(fits));
    return;
  }
  *raw_response_ = SerializeRaw(response);
  Finish(grpc::Status::OK);
}

}  // namespace qpool::api
