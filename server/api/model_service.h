// ModelService: list, load and unload pipelines by name; residency admin (offload, onload, move,
// policy); memory reports, events, cache release and allocator snapshots.
#pragma once

#include "api/engine_refs.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Loads, unloads and residency changes run on the worker of the device they allocate on (the
// target), serialized with that device's requests; the other RPCs are cheap and answer on the
// gRPC thread. WatchMemory streams from a thread of its own per call.
class ModelService final : public v1::ModelService::CallbackService {
 public:
  explicit ModelService(EngineRefs engine) : engine_(engine) {}

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
  // Runs `work` on `device`'s worker and finishes `reactor` with its status (UNAVAILABLE when
  // the worker stops first).
  // Runs `step` on each device's worker in turn (DevicePool::RunInTurn), then `finish` on success,
  // and finishes the reactor with the first error or OK.
  void RunInTurn(std::vector<c10::Device> devices, grpc::ServerUnaryReactor* reactor,
                 DevicePool::Step step, std::function<void()> finish = nullptr);
  grpc::ServerUnaryReactor* Change(grpc::CallbackServerContext* context, const std::string& name,
                                   PipelineRegistry::Change change, const std::string& device,
                                   v1::ResidencyChange* response);

  EngineRefs engine_;
};

}  // namespace qpool::api
