#include "pool/generate_run.h"

#include "util/clock.h"
#include "util/log.h"

namespace qpool {

void GenerateRun::Begin(const RequestContext& context, GenerateCall call,
                        GenerateListener* listener) {
  auto run = std::make_shared<GenerateRun>(context, std::move(call), listener);
  run->run_.QueueWhenLoaded(
      run->call_.pipeline, [run] { return run->Queue(); },
      [run](const Status& status) { run->Finish(status); });
}

GenerateRun::GenerateRun(const RequestContext& context, GenerateCall call,
                         GenerateListener* listener)
    : run_(context, RequestRpc::kGenerate), call_(std::move(call)), listener_(listener) {
  run_.set_deadline(call_.deadline);
}

Status GenerateRun::Queue() {
  ASSIGN_OR_RETURN(LoadedManifest loaded, run_.Manifest(call_.pipeline));
  ASSIGN_OR_RETURN(params_, loaded.kind->ResolveGenerate(call_.request, *loaded.manifest));
  RouteOptions route;
  route.width = params_.width;
  route.height = params_.height;
  route.images = params_.num_images;
  route.steps = params_.steps;
  RETURN_IF_ERROR(run_.Acquire(call_.pipeline, std::move(route)));
  return run_.Dispatch(shared_from_this());
}

bool GenerateRun::Start(bool run, int batch_images) {
  Status started = run_.Start(run, batch_images);
  if (!started.ok() && run_.RetryElsewhere(started, shared_from_this())) return false;
  if (!started.ok()) {
    Finish(started);
    return false;
  }
  if (listener_->Cancelled() || run_.DeadlinePassed()) {
    Finish(run_.StoppedStatus(StrCat("while it waited ", run_.queue_seconds(), " s in the queue")));
    return false;
  }
  batch_images_ = batch_images;
  steps_done_ = 0;
  run_start_ = std::chrono::steady_clock::now();
  device_ = run_.pipeline().device().str();
  return true;
}

BatchItem GenerateRun::Item(int batch_size, bool leader) {
  if (leader) run_.RecordBatch(batch_size);
  BatchItem item;
  item.params = &params_;
  item.progress = [this](int step, int total) {
    run_.StepDone();
    listener_->OnProgress(step, total, SecondsSince(run_start_));
  };
  item.cancelled = [this] {
    if (!listener_->Cancelled() && !run_.DeadlinePassed()) {
      ++steps_done_;
      return false;
    }
    return true;
  };
  // The batch holds the run (its member) until done has run.
  item.done = [this](StatusOr<GenerateOutput> output) { Done(std::move(output)); };
  return item;
}

void GenerateRun::Done(StatusOr<GenerateOutput> output) {
  if (output.status().code() == StatusCode::kCancelled) {
    output = run_.StoppedStatus(StrCat("after ", steps_done_, " of ", params_.steps, " steps"));
  }
  run_.End(output.status(), batch_images_);
  if (!output.ok() && run_.RetryElsewhere(output.status(), shared_from_this())) {
    return;  // runs again on another device
  }
  if (!output.ok()) {
    if (output.status().code() != StatusCode::kCancelled &&
        output.status().code() != StatusCode::kDeadlineExceeded) {
      log::Warn("Generate failed: ", output.status().ToString());
    }
    Finish(output.status());
    return;
  }
  GenerateReply reply;
  reply.images = std::move(output->images);
  reply.params = params_;
  reply.timings = output->timings;
  reply.batch_size = output->batch_size;
  reply.run.device = device_;
  reply.run.route = run_.route();
  reply.run.attempts = run_.attempts();
  reply.run.queue_seconds = run_.queue_seconds();
  reply.run.total_seconds = run_.queue_seconds() + SecondsSince(run_start_);
  Finish(std::move(reply));
}

void GenerateRun::Finish(StatusOr<GenerateReply> reply) {
  run_.Release();  // usually released already; a refused or cancelled run still holds it
  run_.Finish(reply.status().code());
  listener_->OnReply(std::move(reply));
}

}  // namespace qpool
