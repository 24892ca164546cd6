// EncodeReactor: one unary Encode call: the prompts handed to the pool, its reply converted.
#pragma once

#include <chrono>

#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// OK when an Encode reply of `bytes` for `prompts` prompts fits `max_message_bytes`, else
// RESOURCE_EXHAUSTED saying its size, per prompt too, and what would take it: fewer prompts, a
// bfloat16 reply (when it is `float32`), the --max-message-mb.
Status CheckReplySize(size_t bytes, int prompts, int max_message_bytes, bool float32 = false);

// The torch dtype of EncodeRequest.dtype (float32 when unspecified), or INVALID_ARGUMENT naming
// the field and the dtypes it takes.
StatusOr<c10::ScalarType> EncodeReplyDtype(int dtype);

// Owns itself like GenerateReactor (Note [Generate reactor lifetime]): the pool calls OnReply
// exactly once, which finishes the call; OnDone deletes the reactor.
class EncodeReactor final : public grpc::ServerUnaryReactor, public EncodeListener {
 public:
  // Hands the request to `pool`. `raw_response` is gRPC's and stays valid until OnDone; the reply
  // is serialized into it (Note [Requests that do not parse] in api/raw_call.h), its floating
  // tensors in `dtype` (the request's, from EncodeReplyDtype). Past `deadline`
  // (the call's), a request that has not started gets DEADLINE_EXCEEDED. A reply larger than
  // `max_message_bytes` gets RESOURCE_EXHAUSTED saying how large it is per prompt and what to
  // change (an LLM encoder's every-layer states are 64 MiB a prompt for HiDream-I1's Llama).
  EncodeReactor(PipelinePool& pool, const v1::EncodeRequest& request, c10::ScalarType dtype,
                grpc::ByteBuffer* raw_response, std::chrono::system_clock::time_point deadline,
                int max_message_bytes);

  void OnDone() override { delete this; }
  void OnReply(StatusOr<EncodeReply> reply) override;

 private:
  grpc::ByteBuffer* const raw_response_;
  const int max_message_bytes_;
  const int prompts_;
  const c10::ScalarType dtype_;  // of the reply's floating tensors
};

}  // namespace qpool::api
