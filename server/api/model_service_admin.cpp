// ModelService's admin RPCs: residency changes, offload policy, cache release, snapshots.
#include "api/model_service.h"
#include "api/proto_convert.h"

namespace qpool::api {
namespace {

// The device a residency change names: none for an offload.
const std::string& DeviceOf(const v1::OffloadPipelineRequest&) {
  static const std::string kNone;
  return kNone;
}
const std::string& DeviceOf(const v1::OnloadPipelineRequest& request) { return request.device(); }
const std::string& DeviceOf(const v1::MovePipelineRequest& request) { return request.device(); }

}  // namespace

template <typename Request>
grpc::ServerUnaryReactor* ModelService::Change(grpc::CallbackServerContext* context,
                                               const Raw* request, Raw* response,
                                               const char* method, ResidencyChange change) {
  using Call = UnaryCall<Request, v1::ResidencyChange>;
  return ServeUnary<Request, v1::ResidencyChange>(
      access_, CallClass::kAdmin, method, context, request, response, [this, change](Call* call) {
        pool_.ChangeResidency(call->request.name(), change, DeviceOf(call->request),
                              [call](StatusOr<ChangeResult> result) {
                                if (result.ok()) {
                                  ToProto(result->report, &call->response);
                                  ToProto(result->pipeline, call->response.mutable_pipeline());
                                }
                                call->Finish(ToGrpc(result.status()));
                              });
      });
}

grpc::ServerUnaryReactor* ModelService::OffloadPipeline(grpc::CallbackServerContext* context,
                                                        const Raw* request, Raw* response) {
  return Change<v1::OffloadPipelineRequest>(context, request, response, "OffloadPipeline",
                                            ResidencyChange::kOffload);
}

grpc::ServerUnaryReactor* ModelService::OnloadPipeline(grpc::CallbackServerContext* context,
                                                       const Raw* request, Raw* response) {
  return Change<v1::OnloadPipelineRequest>(context, request, response, "OnloadPipeline",
                                           ResidencyChange::kOnload);
}

grpc::ServerUnaryReactor* ModelService::MovePipeline(grpc::CallbackServerContext* context,
                                                     const Raw* request, Raw* response) {
  return Change<v1::MovePipelineRequest>(context, request, response, "MovePipeline",
                                         ResidencyChange::kMove);
}

grpc::ServerUnaryReactor* ModelService::SetOffloadPolicy(grpc::CallbackServerContext* context,
                                                         const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::SetOffloadPolicyRequest, v1::SetOffloadPolicyResponse>;
  return ServeUnary<v1::SetOffloadPolicyRequest, v1::SetOffloadPolicyResponse>(
      access_, CallClass::kAdmin, "SetOffloadPolicy", context, request, response,
      [this](Call* call) {
        auto policy = MakeOffloadPolicy(call->request.policy().policy(),
                                        call->request.policy().idle_seconds());
        if (!policy.ok()) {
          call->Finish(ToGrpc(policy.status()));
          return;
        }
        pool_.SetPolicy(call->request.name(), *policy, [call](StatusOr<PipelineStatus> pipeline) {
          if (pipeline.ok()) ToProto(*pipeline, call->response.mutable_pipeline());
          call->Finish(ToGrpc(pipeline.status()));
        });
      });
}

grpc::ServerUnaryReactor* ModelService::EmptyCache(grpc::CallbackServerContext* context,
                                                   const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::EmptyCacheRequest, v1::EmptyCacheResponse>;
  return ServeUnary<v1::EmptyCacheRequest, v1::EmptyCacheResponse>(
      access_, CallClass::kAdmin, "EmptyCache", context, request, response, [this](Call* call) {
        auto result = pool_.EmptyCache(call->request.device());
        if (result.ok()) {
          for (const auto& stats : result->before) ToProto(stats, call->response.add_before());
          for (const auto& stats : result->after) ToProto(stats, call->response.add_after());
          call->response.set_released_bytes(result->released_bytes);
        }
        call->Finish(ToGrpc(result.status()));
      });
}

grpc::ServerUnaryReactor* ModelService::GetAllocatorSnapshot(grpc::CallbackServerContext* context,
                                                             const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::GetAllocatorSnapshotRequest, v1::AllocatorSnapshot>;
  return ServeUnary<v1::GetAllocatorSnapshotRequest, v1::AllocatorSnapshot>(
      access_, CallClass::kAdmin, "GetAllocatorSnapshot", context, request, response,
      [this](Call* call) {
        auto pickle = pool_.AllocatorSnapshot();
        if (pickle.ok()) call->response.set_pickle(std::move(pickle).value());
        call->Finish(ToGrpc(pickle.status()));
      });
}

}  // namespace qpool::api
