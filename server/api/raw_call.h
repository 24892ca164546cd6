// Requests parsed and responses serialized by qpool's services rather than by gRPC's handlers.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <functional>
#include <string>
#include <utility>

#include "api/access_control.h"
#include "util/log.h"

namespace qpool::api {

// Note [Requests that do not parse]
// gRPC's typed callback handlers answer a request whose bytes do not parse (truncated, a wrong
// wire type, a proto3 string field that is not UTF-8) with UNIMPLEMENTED and an empty message:
// the handler drops the deserialization status, and the call never reaches a service, so no
// metric counts it either. Every qpool RPC is therefore registered raw (the generated
// WithRawCallbackMethod_* handlers hand over the request's bytes) and parsed here, after the
// access check (the bytes of a caller without credentials are never parsed): a request that does
// not parse gets INVALID_ARGUMENT naming its message type, and Generate and Encode count it in
// qpool_requests_total as the pipeline "unknown". Responses are serialized here, once, when the
// call finishes.

// Parses `raw` into `out`; INVALID_ARGUMENT naming the message type when it does not parse.
template <typename Message>
grpc::Status ParseRaw(const grpc::ByteBuffer& raw, Message* out) {
  grpc::ByteBuffer bytes(raw);  // Deserialize consumes its buffer; the copy shares the slices
  if (grpc::SerializationTraits<Message>::Deserialize(&bytes, out).ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      StrCat("the request is not a valid ", out->GetTypeName(),
                             ": truncated, a wrong wire type, or a string field that is not "
                             "UTF-8"));
}

// `message`'s bytes, sharing them with the ByteBuffer where protobuf allows.
template <typename Message>
grpc::ByteBuffer SerializeRaw(const Message& message) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  // Fails only for messages over 2 GiB, which --max-message-mb rules out before sending.
  grpc::SerializationTraits<Message>::Serialize(message, &bytes, &own_buffer);
  return bytes;
}

// One unary call of a raw method: the parsed request and the response the service fills.
// Finish serializes the response (when OK), finishes the call and deletes the UnaryCall; it must
// be called exactly once, from any thread.
template <typename Request, typename Response>
class UnaryCall {
 public:
  UnaryCall(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* raw_response)
      : reactor_(reactor), raw_response_(raw_response) {}
  UnaryCall(const UnaryCall&) = delete;
  UnaryCall& operator=(const UnaryCall&) = delete;

  void Finish(grpc::Status status) {
    if (status.ok()) *raw_response_ = SerializeRaw(response);
    reactor_->Finish(std::move(status));
    delete this;
  }

  Request request;
  Response response;

 private:
  ~UnaryCall() = default;
  grpc::ServerUnaryReactor* const reactor_;
  grpc::ByteBuffer* const raw_response_;  // gRPC's, valid until the call is done
};

// The body of a raw unary method: checks access, parses the request and hands the call to `run`,
// which finishes it (now or later). A refused or unparsable call is finished here; `unparsable`
// (if set) is told about the latter.
template <typename Request, typename Response, typename Run>
grpc::ServerUnaryReactor* ServeUnary(
    const AccessControl& access, CallClass call_class, const char* method,
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response, Run run,
    const std::function<void(const grpc::Status&)>& unparsable = nullptr) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status allowed = access.Check(*context, call_class, method);
  if (!allowed.ok()) {
    reactor->Finish(std::move(allowed));
    return reactor;
  }
  auto* call = new UnaryCall<Request, Response>(reactor, raw_response);
  grpc::Status parsed = ParseRaw(*raw_request, &call->request);
  if (!parsed.ok()) {
    if (unparsable) unparsable(parsed);
    call->Finish(std::move(parsed));
    return reactor;
  }
  run(call);
  return reactor;
}

// A server-streaming call answered with `status` and no message (a refused or unparsable call);
// deletes itself when gRPC is done with it.
class FinishedWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FinishedWriter(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace qpool::api
