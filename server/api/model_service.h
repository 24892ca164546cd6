// ModelService: list, load and unload pipelines by name; residency admin (offload, onload, move,
// policy); memory reports, events, cache release and allocator snapshots.
#pragma once

#include "api/access_control.h"
#include "api/raw_call.h"
#include "api/watch_hub.h"
#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Every ModelService RPC registered raw (Note [Requests that do not parse] in api/raw_call.h).
// clang-format off
using RawModelService =
    v1::ModelService::WithRawCallbackMethod_ListPipelines<
    v1::ModelService::WithRawCallbackMethod_LoadPipeline<
    v1::ModelService::WithRawCallbackMethod_UnloadPipeline<
    v1::ModelService::WithRawCallbackMethod_GetMemoryReport<
    v1::ModelService::WithRawCallbackMethod_WatchMemory<
    v1::ModelService::WithRawCallbackMethod_OffloadPipeline<
    v1::ModelService::WithRawCallbackMethod_OnloadPipeline<
    v1::ModelService::WithRawCallbackMethod_MovePipeline<
    v1::ModelService::WithRawCallbackMethod_SetOffloadPolicy<
    v1::ModelService::WithRawCallbackMethod_EmptyCache<
    v1::ModelService::WithRawCallbackMethod_GetAllocatorSnapshot<
    v1::ModelService::Service>>>>>>>>>>>;
// clang-format on

// Every RPC is one PipelinePool verb. Loads, unloads and residency changes run on the workers of
// the devices they touch and finish the call from there; the other RPCs are cheap and answer on
// the gRPC thread. WatchMemory streams hold no thread (Note [Watchers without threads]). Each
// RPC checks access, then parses its request (Note [Requests that do not parse]).
class ModelService final : public RawModelService {
 public:
  // `pool`, `watchers` and `access` outlive the service.
  ModelService(PipelinePool& pool, WatchHub& watchers, const AccessControl& access)
      : pool_(pool), watchers_(watchers), access_(access) {}

  using Raw = grpc::ByteBuffer;
  grpc::ServerUnaryReactor* ListPipelines(grpc::CallbackServerContext* context, const Raw* request,
                                          Raw* response) override;
  grpc::ServerUnaryReactor* LoadPipeline(grpc::CallbackServerContext* context, const Raw* request,
                                         Raw* response) override;
  grpc::ServerUnaryReactor* UnloadPipeline(grpc::CallbackServerContext* context, const Raw* request,
                                           Raw* response) override;
  grpc::ServerUnaryReactor* GetMemoryReport(grpc::CallbackServerContext* context,
                                            const Raw* request, Raw* response) override;
  grpc::ServerWriteReactor<Raw>* WatchMemory(grpc::CallbackServerContext* context,
                                             const Raw* request) override;
  // model_service_admin.cpp
  grpc::ServerUnaryReactor* OffloadPipeline(grpc::CallbackServerContext* context,
                                            const Raw* request, Raw* response) override;
  grpc::ServerUnaryReactor* OnloadPipeline(grpc::CallbackServerContext* context, const Raw* request,
                                           Raw* response) override;
  grpc::ServerUnaryReactor* MovePipeline(grpc::CallbackServerContext* context, const Raw* request,
                                         Raw* response) override;
  grpc::ServerUnaryReactor* SetOffloadPolicy(grpc::CallbackServerContext* context,
                                             const Raw* request, Raw* response) override;
  grpc::ServerUnaryReactor* EmptyCache(grpc::CallbackServerContext* context, const Raw* request,
                                       Raw* response) override;
  grpc::ServerUnaryReactor* GetAllocatorSnapshot(grpc::CallbackServerContext* context,
                                                 const Raw* request, Raw* response) override;

 private:
  // OffloadPipeline, OnloadPipeline and MovePipeline, once parsed.
  template <typename Request>
  grpc::ServerUnaryReactor* Change(grpc::CallbackServerContext* context, const Raw* request,
                                   Raw* response, const char* method, ResidencyChange change);

  PipelinePool& pool_;
  WatchHub& watchers_;
  const AccessControl& access_;
};

}  // namespace qpool::api
