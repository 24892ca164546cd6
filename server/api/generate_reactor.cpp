#include "api/generate_reactor.h"

#include "api/proto_convert.h"
#include "util/clock.h"
#include "util/log.h"

namespace qpool::api {
GenerateReactor::GenerateReactor(const EngineRefs& engine, const v1::GenerateRequest& request,
                                 std::chrono::system_clock::time_point deadline)
    : call_(engine, RequestRpc::kGenerate) {
  call_.set_deadline(deadline);
  call_.QueueWhenLoaded(
      request.pipeline(), [this, request] { return Queue(request); },
      [this](const Status& status) { FinishAfterWrites(ToGrpc(status)); });
}

// Forwards the batch runner's calls to the reactor; see Note [Generate reactor lifetime].
class GenerateReactor::Member final : public BatchMember {
 public:
  explicit Member(GenerateReactor* reactor) : reactor_(reactor) {}
  const GenerateParams& params() const override { return reactor_->params_; }
  SdPipeline& pipeline() override { return reactor_->call_.pipeline(); }
  bool Start(bool run, int batch_images) override { return reactor_->Start(run, batch_images); }
  BatchItem Item(int batch_size, bool leader) override {
    return reactor_->Item(batch_size, leader);
  }

 private:
  GenerateReactor* const reactor_;
};

Status GenerateReactor::Queue(const v1::GenerateRequest& request) {
  ASSIGN_OR_RETURN(auto manifest, call_.Manifest(request.pipeline()));
  ASSIGN_OR_RETURN(params_, ResolveGenerateRequest(FromProto(request), *manifest));
  RouteOptions route;
  route.width = params_.width;
  route.height = params_.height;
  route.images = params_.num_images;
  route.steps = params_.steps;
  RETURN_IF_ERROR(call_.Acquire(request.pipeline(), std::move(route)));
  member_ = std::make_shared<Member>(this);
  return call_.Dispatch(member_);
}

void GenerateReactor::OnDone() {
  // Every operation has completed, so final_status_ is no longer written.
  call_.Finish(final_status_.error_code());
  delete this;
}

bool GenerateReactor::Start(bool run, int batch_images) {
  Status started = call_.Start(run, batch_images);
  if (!started.ok() && call_.RetryElsewhere(started, member_)) return false;
  if (!started.ok()) {
    FinishAfterWrites(ToGrpc(started));
    return false;
  }
  if (cancelled_ || call_.DeadlinePassed()) {
    FinishAfterWrites(ToGrpc(
        call_.StoppedStatus(StrCat("while it waited ", call_.queue_seconds(), " s in the queue"))));
    return false;
  }
  batch_images_ = batch_images;
  steps_done_ = 0;
  queue_seconds_ = call_.queue_seconds();
  run_start_ = std::chrono::steady_clock::now();
  device_ = call_.pipeline().device().str();
  return true;
}

BatchItem GenerateReactor::Item(int batch_size, bool leader) {
  if (leader) call_.RecordBatch(batch_size);
  BatchItem item;
  item.params = &params_;
  item.progress = [this](int step, int total) {
    call_.StepDone();
    v1::GenerateResponse message;
    auto* p = message.mutable_progress();
    p->set_step(static_cast<uint32_t>(step));
    p->set_total(static_cast<uint32_t>(total));
    p->set_elapsed_seconds(SecondsSince(run_start_));
    Push(std::move(message));
  };
  item.cancelled = [this] {
    if (!cancelled_.load() && !call_.DeadlinePassed()) {
      ++steps_done_;
      return false;
    }
    return true;
  };
  item.done = [this](StatusOr<GenerateOutput> output) { Done(std::move(output)); };
  return item;
}

void GenerateReactor::Done(StatusOr<GenerateOutput> output) {
  if (output.status().code() == StatusCode::kCancelled) {
    output = call_.StoppedStatus(StrCat("after ", steps_done_, " of ", params_.steps, " steps"));
  }
  call_.End(output.status(), batch_images_);
  if (!output.ok() && call_.RetryElsewhere(output.status(), member_)) {
    return;  // runs again on another device
  }
  if (!output.ok()) {
    if (output.status().code() != StatusCode::kCancelled &&
        output.status().code() != StatusCode::kDeadlineExceeded) {
      log::Warn("Generate failed: ", output.status().ToString());
    }
    FinishAfterWrites(ToGrpc(output.status()));
    return;
  }
  v1::GenerateResponse message;
  auto* result = message.mutable_result();
  for (auto& image : output->images) {
    auto* out = result->add_images();
    out->set_png(std::move(image.png));
    out->set_width(static_cast<uint32_t>(image.width));
    out->set_height(static_cast<uint32_t>(image.height));
  }
  result->set_seed(params_.seed);
  result->set_device(device_);
  result->set_scheduler(params_.scheduler);
  result->set_steps(static_cast<uint32_t>(params_.steps));
  result->set_guidance_scale(static_cast<float>(params_.guidance_scale));
  result->set_route(call_.route());
  result->set_attempts(static_cast<uint32_t>(call_.attempts()));
  result->set_batch_size(static_cast<uint32_t>(output->batch_size));
  auto* timings = result->mutable_timings();
  timings->set_queue_seconds(queue_seconds_);
  timings->set_encode_seconds(output->timings.encode_seconds);
  timings->set_denoise_seconds(output->timings.denoise_seconds);
  timings->set_decode_seconds(output->timings.decode_seconds);
  timings->set_total_seconds(queue_seconds_ + SecondsSince(run_start_));
  Push(std::move(message));
  FinishAfterWrites(grpc::Status::OK);
}

void GenerateReactor::Push(v1::GenerateResponse message) {
  const v1::GenerateResponse* to_write = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(message));
    if (writing_) return;
    writing_ = true;
    to_write = &pending_.front();
  }
  StartWrite(to_write);
}

void GenerateReactor::FinishAfterWrites(grpc::Status status) {
  call_.Release();  // usually released already; a refused or cancelled call still holds it
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_status_ = std::move(status);
    finish_requested_ = true;
    if (writing_) return;  // OnWriteDone finishes once the queue drains
  }
  Finish(final_status_);
}

void GenerateReactor::OnWriteDone(bool ok) {
  const v1::GenerateResponse* to_write = nullptr;
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
