#include "api/generate_reactor.h"

#include "api/proto_convert.h"
#include "api/raw_call.h"

namespace qpool::api {

GenerateReactor::GenerateReactor(PipelinePool& pool, const v1::GenerateRequest& request,
                                 std::chrono::system_clock::time_point deadline) {
  GenerateCall call;
  call.pipeline = request.pipeline();
  call.request = FromProto(request);
  call.deadline = deadline;
  pool.Generate(std::move(call), this);
}

void GenerateReactor::OnProgress(int step, int total, double elapsed_seconds) {
  v1::GenerateResponse message;
  auto* p = message.mutable_progress();
  p->set_step(static_cast<uint32_t>(step));
  p->set_total(static_cast<uint32_t>(total));
  p->set_elapsed_seconds(elapsed_seconds);
  Push(std::move(message));
}

void GenerateReactor::OnReply(StatusOr<GenerateReply> reply) {
  if (!reply.ok()) {
    FinishAfterWrites(ToGrpc(reply.status()));
    return;
  }
  v1::GenerateResponse message;
  ToProto(std::move(reply).value(), message.mutable_result());
  Push(std::move(message));
  FinishAfterWrites(grpc::Status::OK);
}

void GenerateReactor::Push(v1::GenerateResponse message) {
  grpc::ByteBuffer bytes = SerializeRaw(message);
  const grpc::ByteBuffer* to_write = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(bytes));
    if (writing_) return;
    writing_ = true;
    to_write = &pending_.front();
  }
  StartWrite(to_write);
}

void GenerateReactor::FinishAfterWrites(grpc::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_status_ = std::move(status);
    finish_requested_ = true;
    if (writing_) return;  // OnWriteDone finishes once the queue drains
  }
  Finish(final_status_);
}

void GenerateReactor::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* to_write = nullptr;
  bool finish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.pop_front();
    if (!ok) {
      cancelled_ = true;  // the stream broke: stop the work and drop what is queued
      pending_.clear();
    }
    if (!pending_.empty()) {
      to_write = &pending_.front();
    } else {
      writing_ = false;
      finish = finish_requested_;
    }
  }
  if (to_write != nullptr) {
    StartWrite(to_write);
  } else if (finish) {
    Finish(final_status_);
  }
}

}  // namespace qpool::api
