// ModelService: list, load and unload pipelines by name; residency admin (offload, onload, move,
// policy); memory reports, events, cache release and allocator snapshots.
#pragma once

#include "api/access_control.h"
#include "api/watch_hub.h"
#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Every RPC is one PipelinePool verb. Loads, unloads and residency changes run on the workers of
// the devices they touch and finish the call from there; the other RPCs are cheap and answer on
// the gRPC thread. WatchMemory streams hold no thread (Note [Watchers without threads]).
class ModelService final : public v1::ModelService::CallbackService {
 public:
  // `pool`, `watchers` and `access` outlive the service.
  ModelService(PipelinePool& pool, WatchHub& watchers, const AccessControl& access)
      : pool_(pool), watchers_(watchers), access_(access) {}

  grpc::ServerUnaryReactor* ListPipelines(grpc::CallbackServerContext* context,
                                          const v1::ListPipelinesRequest* request,
                                          v1::ListPipelinesResponse* response) override;
  grpc::ServerUnaryReactor* LoadPipeline(grpc::CallbackServerContext* context,
                                         const v1::LoadPipelineRequest* request,
                                         v1::LoadPipelineResponse* response) override;
  grpc::ServerUnaryReactor* UnloadPipeline(grpc::CallbackServerContext* context,
                                           const v1::UnloadPipelineRequest* request,
                                           v1::UnloadPipelineResponse* response) override;
  grpc::ServerUnaryReactor* GetMemoryReport(grpc::CallbackServerContext* context,
                                            const v1::GetMemoryReportRequest* request,
                                            v1::MemoryReport* response) override;
  grpc::ServerWriteReactor<v1::MemoryEvent>* WatchMemory(
      grpc::CallbackServerContext* context, const v1::WatchMemoryRequest* request) override;
  // model_service_admin.cpp
  grpc::ServerUnaryReactor* OffloadPipeline(grpc::CallbackServerContext* context,
                                            const v1::OffloadPipelineRequest* request,
                                            v1::ResidencyChange* response) override;
  grpc::ServerUnaryReactor* OnloadPipeline(grpc::CallbackServerContext* context,
                                           const v1::OnloadPipelineRequest* request,
                                           v1::ResidencyChange* response) override;
  grpc::ServerUnaryReactor* MovePipeline(grpc::CallbackServerContext* context,
                                         const v1::MovePipelineRequest* request,
                                         v1::ResidencyChange* response) override;
  grpc::ServerUnaryReactor* SetOffloadPolicy(grpc::CallbackServerContext* context,
                                             const v1::SetOffloadPolicyRequest* request,
                                             v1::SetOffloadPolicyResponse* response) override;
  grpc::ServerUnaryReactor* EmptyCache(grpc::CallbackServerContext* context,
                                       const v1::EmptyCacheRequest* request,
                                       v1::EmptyCacheResponse* response) override;
  grpc::ServerUnaryReactor* GetAllocatorSnapshot(grpc::CallbackServerContext* context,
                                                 const v1::GetAllocatorSnapshotRequest* request,
                                                 v1::AllocatorSnapshot* response) override;

 private:
  // OffloadPipeline, OnloadPipeline and MovePipeline.
  grpc::ServerUnaryReactor* Change(grpc::CallbackServerContext* context, const std::string& name,
                                   ResidencyChange change, const std::string& device,
                                   v1::ResidencyChange* response);

  PipelinePool& pool_;
  WatchHub& watchers_;
  const AccessControl& access_;
};

}  // namespace qpool::api
