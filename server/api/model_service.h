// ModelService: list, load and unload pipelines by name; report memory.
#pragma once

#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::api {

// Loads run on the target device's worker (they allocate on that device); the other RPCs are
// cheap and answer on the gRPC thread.
class ModelService final : public v1::ModelService::CallbackService {
 public:
  ModelService(PipelineRegistry& registry, DevicePool& devices)
      : registry_(registry), devices_(devices) {}

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

 private:
  PipelineRegistry& registry_;
  DevicePool& devices_;
};

}  // namespace qpool::api
