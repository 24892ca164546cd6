#include "pool/request_run.h"

#include <utility>

#include "pool/pipeline_loader.h"
#include "util/log.h"

namespace qpool {
namespace {

// `options` for a run of `batch_images` images in all (0: the request's own).
RouteOptions WithImages(RouteOptions options, int batch_images) {
  if (batch_images > 0) options.images = batch_images;
  return options;
}

}  // namespace

RequestRun::RequestRun(const RequestContext& context, RequestRpc rpc)
    : registry_(*context.registry),
      draining_(context.draining),
      loader_(context.loader),
      requests_(context.requests),
      recorder_(context, rpc) {}

void RequestRun::SetRunning(bool running) {
  if (requests_ == nullptr || running == running_) return;
  running_ = running;
  requests_->AddRunning(name_, running ? 1 : -1);
}

StatusOr<LoadedManifest> RequestRun::Manifest(const std::string& name) {
  auto manifest = registry_.Manifest(name);
  recorder_.SetPipeline(name, manifest.status());  // labels from the registry's answer only
  not_loaded_ = manifest.status().code() == StatusCode::kFailedPrecondition;
  if (draining_ != nullptr && draining_->load()) {
    return Unavailable(
        "the server is draining before it stops; send the request to another "
        "replica of the service");
  }
  return manifest;
}

void RequestRun::QueueWhenLoaded(const std::string& name, std::function<Status()> queue,
                                 std::function<void(const Status&)> fail) {
  Status queued = queue();
  if (queued.ok()) return;
  if (loader_ == nullptr || !not_loaded_ || (draining_ != nullptr && draining_->load())) {
    fail(queued);
    return;
  }
  loader_->EnsureLoaded(name,
                        [queue = std::move(queue), fail = std::move(fail)](const Status& loaded) {
                          Status again = loaded.ok() ? queue() : loaded;
                          if (!again.ok()) fail(again);
                        });
}

Status RequestRun::Acquire(const std::string& name, RouteOptions options) {
  name_ = name;
  options_ = std::move(options);
  auto lease = registry_.Acquire(name, options_);
  recorder_.SetPipeline(name, lease.status());
  if (!lease.ok()) return lease.status();
  lease_ = std::move(lease).value();
  route_ = lease_->route().reason;
  return Status::Ok();
}

Status RequestRun::Submit(DeviceWorker::Task task) {
  Status submitted = lease_->worker().Submit(std::move(task));
  if (!submitted.ok()) lease_.reset();
  return submitted;
}

Status RequestRun::Dispatch(const std::shared_ptr<BatchMember>& member) {
  std::shared_ptr<BatchQueue> batches = lease_->batches();
  batches->Add(member);
  Status submitted = lease_->worker().Submit([batches](bool run) { batches->RunNext(run); });
  if (submitted.ok() || !batches->Remove(member.get())) return Status::Ok();
  lease_.reset();
  return submitted;
}

Status RequestRun::Start(bool run, int batch_images) {
  if (!run) {
    lease_.reset();
    return Unavailable("server is shutting down");
  }
  ++attempts_;
  last_device_ = lease_->pipeline().device().str();
  if (DeadlinePassed()) {  // before Admit: no eviction for a request that will not run
    lease_.reset();
    return StoppedStatus(
        StrCat("while it waited ", recorder_.seconds_since_arrival(), " s in the queue"));
  }
  Status admitted = registry_.Admit(*lease_, WithImages(options_, batch_images));
  if (!admitted.ok()) {
    lease_.reset();
    return admitted;
  }
  recorder_.RunStarted(lease_->pipeline().device());
  SetRunning(true);
  return Status::Ok();
}

void RequestRun::End(const Status& status, int batch_images) {
  SetRunning(false);
  recorder_.RunEnded(status);
  if (status.ok() && recorder_.working_bytes() > 0) {
    registry_.ObserveWorkingMemory(name_, WithImages(options_, batch_images),
                                   recorder_.working_bytes());
  }
  if (lease_) registry_.FitGraphs(*lease_);
  lease_.reset();
}

Status RequestRun::StoppedStatus(const std::string& where) const {
  if (DeadlinePassed()) return DeadlineExceeded(StrCat("the request's deadline passed ", where));
  if (draining_ != nullptr && draining_->load()) {
    return Cancelled(StrCat("request cancelled: the server's drain time ran out ", where));
  }
  return Cancelled(StrCat("request cancelled by the client ", where));
}

bool RequestRun::RetryElsewhere(const Status& failure, DeviceWorker::Task task) {
  return Reroute(failure, [this, &task] { return Submit(std::move(task)); });
}

bool RequestRun::RetryElsewhere(const Status& failure, const std::shared_ptr<BatchMember>& member) {
  return Reroute(failure, [this, &member] { return Dispatch(member); });
}

bool RequestRun::Reroute(const Status& failure, const std::function<Status()>& queue) {
  if (failure.code() != StatusCode::kResourceExhausted || attempts_ != 1 || lease_) return false;
  // Both a run that ran out of memory and a Start whose budget could not make room mean this
  // device is short now; another device's replica may not be.
  RouteOptions retry = options_;
  retry.exclude.push_back(last_device_);
  auto lease = registry_.Acquire(name_, retry);
  if (!lease.ok()) return false;
  lease_ = std::move(lease).value();
  const std::string to = lease_->pipeline().device().str();
  if (!queue().ok()) return false;
  log::Warn("request of '", name_, "' ran out of memory on ", last_device_, "; retrying on ", to);
  route_ = "retry-oom";
  return true;
}

}  // namespace qpool
