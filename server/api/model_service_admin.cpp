// ModelService's admin RPCs: residency changes, offload policy, cache release, snapshots.
#include "api/model_service.h"
#include "api/proto_convert.h"

namespace qpool::api {

grpc::ServerUnaryReactor* ModelService::Change(grpc::CallbackServerContext* context,
                                               const std::string& name, ResidencyChange change,
                                               const std::string& device,
                                               v1::ResidencyChange* response) {
  auto* reactor = context->DefaultReactor();
  pool_.ChangeResidency(name, change, device, [reactor, response](StatusOr<ChangeResult> result) {
    if (result.ok()) {
      ToProto(result->report, response);
      ToProto(result->pipeline, response->mutable_pipeline());
    }
    reactor->Finish(ToGrpc(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::OffloadPipeline(grpc::CallbackServerContext* context,
                                                        const v1::OffloadPipelineRequest* request,
                                                        v1::ResidencyChange* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "OffloadPipeline");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  return Change(context, request->name(), ResidencyChange::kOffload, "", response);
}

grpc::ServerUnaryReactor* ModelService::OnloadPipeline(grpc::CallbackServerContext* context,
                                                       const v1::OnloadPipelineRequest* request,
                                                       v1::ResidencyChange* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "OnloadPipeline");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  return Change(context, request->name(), ResidencyChange::kOnload, request->device(), response);
}

grpc::ServerUnaryReactor* ModelService::MovePipeline(grpc::CallbackServerContext* context,
                                                     const v1::MovePipelineRequest* request,
                                                     v1::ResidencyChange* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "MovePipeline");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  return Change(context, request->name(), ResidencyChange::kMove, request->device(), response);
}

grpc::ServerUnaryReactor* ModelService::SetOffloadPolicy(grpc::CallbackServerContext* context,
                                                         const v1::SetOffloadPolicyRequest* request,
                                                         v1::SetOffloadPolicyResponse* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "SetOffloadPolicy");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  auto* reactor = context->DefaultReactor();
  auto policy = MakeOffloadPolicy(request->policy().policy(), request->policy().idle_seconds());
  if (!policy.ok()) {
    reactor->Finish(ToGrpc(policy.status()));
    return reactor;
  }
  pool_.SetPolicy(request->name(), *policy, [reactor, response](StatusOr<PipelineStatus> pipeline) {
    if (pipeline.ok()) ToProto(*pipeline, response->mutable_pipeline());
    reactor->Finish(ToGrpc(pipeline.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::EmptyCache(grpc::CallbackServerContext* context,
                                                   const v1::EmptyCacheRequest* request,
                                                   v1::EmptyCacheResponse* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "EmptyCache");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  auto* reactor = context->DefaultReactor();
  auto result = pool_.EmptyCache(request->device());
  if (result.ok()) {
    for (const auto& stats : result->before) ToProto(stats, response->add_before());
    for (const auto& stats : result->after) ToProto(stats, response->add_after());
    response->set_released_bytes(result->released_bytes);
  }
  reactor->Finish(ToGrpc(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::GetAllocatorSnapshot(
    grpc::CallbackServerContext* context, const v1::GetAllocatorSnapshotRequest* request,
    v1::AllocatorSnapshot* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "GetAllocatorSnapshot");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  auto* reactor = context->DefaultReactor();
  auto pickle = pool_.AllocatorSnapshot();
  if (pickle.ok()) response->set_pickle(std::move(pickle).value());
  reactor->Finish(ToGrpc(pickle.status()));
  return reactor;
}

}  // namespace qpool::api
