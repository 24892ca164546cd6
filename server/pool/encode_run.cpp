#include "pool/encode_run.h"

namespace qpool {

void EncodeRun::Begin(const RequestContext& context, EncodeCall call, EncodeListener* listener) {
  auto run = std::make_shared<EncodeRun>(context, std::move(call), listener);
  run->run_.QueueWhenLoaded(
      run->call_.pipeline, [run] { return run->Queue(); },
      [run](const Status& status) { run->Finish(status); });
}

EncodeRun::EncodeRun(const RequestContext& context, EncodeCall call, EncodeListener* listener)
    : run_(context, RequestRpc::kEncode), call_(std::move(call)), listener_(listener) {
  run_.set_deadline(call_.deadline);
}

Status EncodeRun::Queue() {
  ASSIGN_OR_RETURN(LoadedManifest loaded, run_.Manifest(call_.pipeline));
  RETURN_IF_ERROR(loaded.kind->ValidateEncode(call_.prompts, *loaded.manifest));
  RETURN_IF_ERROR(run_.Acquire(call_.pipeline, RouteOptions{}));
  return run_.Submit([self = shared_from_this()](bool run) { self->Run(run); });
}

void EncodeRun::Run(bool run) {
  auto retry = [self = shared_from_this()](bool run) { self->Run(run); };
  Status started = run_.Start(run);
  if (!started.ok() && run_.RetryElsewhere(started, retry)) return;
  if (!started.ok()) {
    Finish(started);
    return;
  }
  if (run_.DeadlinePassed()) {
    Finish(run_.StoppedStatus(StrCat("while it waited ", run_.queue_seconds(), " s in the queue")));
    return;
  }
  Pipeline& pipeline = run_.pipeline();
  auto out = pipeline.Encode(call_.prompts);
  const std::string device = pipeline.device().str();
  run_.End(out.status());
  if (!out.ok() && run_.RetryElsewhere(out.status(), retry)) return;
  if (!out.ok()) {
    Finish(out.status());
    return;
  }
  EncodeReply reply;
  reply.output = std::move(out).value();
  reply.run.device = device;
  reply.run.route = run_.route();
  reply.run.attempts = run_.attempts();
  reply.run.queue_seconds = run_.queue_seconds();
  Finish(std::move(reply));
}

void EncodeRun::Finish(StatusOr<EncodeReply> reply) {
  run_.Release();  // usually released already; a refused run still holds it
  run_.Finish(reply.status().code());
  listener_->OnReply(std::move(reply));
}

}  // namespace qpool
