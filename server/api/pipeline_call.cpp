#include "api/pipeline_call.h"

#include <utility>

namespace qpool::api {

PipelineCall::PipelineCall(const EngineRefs& engine, RequestRpc rpc)
    : registry_(*engine.registry), recorder_(engine, rpc) {}

Status PipelineCall::Acquire(const std::string& name) {
  auto lease = registry_.Acquire(name);
  recorder_.SetPipeline(name, lease.status());
  if (!lease.ok()) return lease.status();
  lease_ = std::move(lease).value();
  return Status::Ok();
}

Status PipelineCall::Submit(DeviceWorker::Task task) {
  Status submitted = lease_->worker().Submit(std::move(task));
  if (!submitted.ok()) lease_.reset();
  return submitted;
}

Status PipelineCall::Start(bool run) {
  if (!run) {
    lease_.reset();
    return Unavailable("server is shutting down");
  }
  recorder_.RunStarted(lease_->pipeline().device());
  return Status::Ok();
}

void PipelineCall::End(const Status& status) {
  recorder_.RunEnded(status);
  lease_.reset();
}

}  // namespace qpool::api
