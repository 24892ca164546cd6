// ModelService's admin RPCs: residency changes, offload policy, cache release, snapshots.
#include <ATen/Context.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include "api/model_service.h"
#include "api/proto_convert.h"

namespace qpool::api {

grpc::ServerUnaryReactor* ModelService::Change(grpc::CallbackServerContext* context,
                                               const std::string& name,
                                               PipelineRegistry::Change change,
                                               const std::string& device,
                                               v1::ResidencyChange* response) {
  auto* reactor = context->DefaultReactor();
  auto plan = engine_.registry->PlanChange(name, change, device);
  if (!plan.ok()) {
    reactor->Finish(ToGrpc(plan.status()));
    return reactor;
  }
  // Each replica changes on the worker of its target device, one after the other.
  auto targets = std::make_shared<std::map<std::string, c10::Device>>();
  std::vector<c10::Device> devices;
  for (const auto& [replica, target] : *plan) {
    targets->emplace(target.str(), replica);
    devices.push_back(target);
  }
  RunInTurn(
      devices, reactor,
      [this, response, name, change, targets](const c10::Device& target) -> Status {
        ASSIGN_OR_RETURN(ResidencyReport report,
                         engine_.registry->ChangeResidency(name, targets->at(target.str()),
                                                           change, target));
        ToProto(report, response);
        return Status::Ok();
      },
      [this, response, name] {
        if (auto status = engine_.registry->LoadedStatus(name)) {
          ToProto(*status, response->mutable_pipeline());
        }
      });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::OffloadPipeline(grpc::CallbackServerContext* context,
                                                        const v1::OffloadPipelineRequest* request,
                                                        v1::ResidencyChange* response) {
  return Change(context, request->name(), PipelineRegistry::Change::kOffload, "", response);
}

grpc::ServerUnaryReactor* ModelService::OnloadPipeline(grpc::CallbackServerContext* context,
                                                       const v1::OnloadPipelineRequest* request,
                                                       v1::ResidencyChange* response) {
  return Change(context, request->name(), PipelineRegistry::Change::kOnload, request->device(),
                response);
}

grpc::ServerUnaryReactor* ModelService::MovePipeline(grpc::CallbackServerContext* context,
                                                     const v1::MovePipelineRequest* request,
                                                     v1::ResidencyChange* response) {
  return Change(context, request->name(), PipelineRegistry::Change::kMove, request->device(),
                response);
}

grpc::ServerUnaryReactor* ModelService::SetOffloadPolicy(grpc::CallbackServerContext* context,
                                                         const v1::SetOffloadPolicyRequest* request,
                                                         v1::SetOffloadPolicyResponse* response) {
  auto* reactor = context->DefaultReactor();
  const std::string name = request->name();
  auto policy = MakeOffloadPolicy(request->policy().policy(), request->policy().idle_seconds());
  if (!policy.ok()) {
    reactor->Finish(ToGrpc(policy.status()));
    return reactor;
  }
  auto plan = engine_.registry->PlanChange(name, PipelineRegistry::Change::kOffload, "");
  if (!plan.ok()) {
    reactor->Finish(ToGrpc(plan.status()));
    return reactor;
  }
  std::vector<c10::Device> devices;
  for (const auto& [replica, target] : *plan) devices.push_back(replica);
  RunInTurn(
      devices, reactor,
      [this, name, policy = *policy](const c10::Device& device) {
        return engine_.registry->SetPolicy(name, device, policy);
      },
      [this, response, name] {
        if (auto status = engine_.registry->LoadedStatus(name)) {
          ToProto(*status, response->mutable_pipeline());
        }
      });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::EmptyCache(grpc::CallbackServerContext* context,
                                                   const v1::EmptyCacheRequest* request,
                                                   v1::EmptyCacheResponse* response) {
  auto* reactor = context->DefaultReactor();
  std::vector<c10::Device> devices;
  for (const auto& d : engine_.devices->devices()) {
    if (request->device().empty() || d.str() == request->device()) devices.push_back(d);
  }
  if (devices.empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "device '" + request->device() + "' is not served here"));
    return reactor;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto before = engine_.memory->ReadAll(devices);
  engine_.memory->EmptyCache();
  const auto after = engine_.memory->ReadAll(devices);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t released = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    ToProto(before[i], response->add_before());
    ToProto(after[i], response->add_after());
    if (before[i].reserved_bytes > after[i].reserved_bytes) {
      released += before[i].reserved_bytes - after[i].reserved_bytes;
    }
    if (!devices[i].is_cuda()) continue;
    MemoryEvent e;
    e.kind = MemoryEventKind::kEmptyCache;
    e.device = devices[i].str();
    e.allocated_before = before[i].allocated_bytes;
    e.allocated_after = after[i].allocated_bytes;
    e.reserved_before = before[i].reserved_bytes;
    e.reserved_after = after[i].reserved_bytes;
    e.duration_seconds = seconds;
    engine_.events->Append(std::move(e));
  }
  response->set_released_bytes(released);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::GetAllocatorSnapshot(
    grpc::CallbackServerContext* context, const v1::GetAllocatorSnapshotRequest* request,
    v1::AllocatorSnapshot* response) {
  auto* reactor = context->DefaultReactor();
  if (!at::globalContext().hasCUDA()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "no CUDA device: the allocator snapshot covers GPUs only"));
    return reactor;
  }
  try {
    response->set_pickle(torch::cuda::_memory_snapshot_pickled());
    reactor->Finish(grpc::Status::OK);
  } catch (const c10::Error& e) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::INTERNAL,
                     std::string("allocator snapshot failed: ") + e.what_without_backtrace()));
  }
  return reactor;
}

}  // namespace qpool::api
