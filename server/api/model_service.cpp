#include "api/model_service.h"

#include "api/proto_convert.h"
#include "memory/device_memory.h"

namespace qpool::api {

grpc::ServerUnaryReactor* ModelService::ListPipelines(grpc::CallbackServerContext* context,
                                                      const v1::ListPipelinesRequest* request,
                                                      v1::ListPipelinesResponse* response) {
  for (const auto& status : registry_.List()) ToProto(status, response->add_pipelines());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::LoadPipeline(grpc::CallbackServerContext* context,
                                                     const v1::LoadPipelineRequest* request,
                                                     v1::LoadPipelineResponse* response) {
  auto* reactor = context->DefaultReactor();
  auto device = registry_.PlanDevice(request->name(), request->device());
  if (!device.ok()) {
    reactor->Finish(ToGrpc(device.status()));
    return reactor;
  }
  const std::string name = request->name();
  const std::string wanted = request->device();  // Load resolves it again, same answer
  Status submitted = devices_.worker(*device).Submit(
      [this, reactor, response, name, wanted](bool run) {
        if (!run) {
          reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down"));
          return;
        }
        auto result = registry_.Load(name, wanted);
        if (!result.ok()) {
          reactor->Finish(ToGrpc(result.status()));
          return;
        }
        ToProto(result->pipeline, response->mutable_pipeline());
        response->set_load_seconds(result->load_seconds);
        response->set_already_loaded(result->already_loaded);
        reactor->Finish(grpc::Status::OK);
      });
  if (!submitted.ok()) reactor->Finish(ToGrpc(submitted));
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::UnloadPipeline(grpc::CallbackServerContext* context,
                                                       const v1::UnloadPipelineRequest* request,
                                                       v1::UnloadPipelineResponse* response) {
  auto* reactor = context->DefaultReactor();
  auto freed = registry_.Unload(request->name());
  if (freed.ok()) {
    response->set_name(request->name());
    response->set_freed_bytes(*freed);
  }
  reactor->Finish(ToGrpc(freed.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::GetMemoryReport(grpc::CallbackServerContext* context,
                                                        const v1::GetMemoryReportRequest* request,
                                                        v1::MemoryReport* response) {
  for (const auto& stats : ReadDeviceMemory(devices_.devices())) {
    ToProto(stats, response->add_devices());
  }
  for (const auto& status : registry_.ListLoaded()) ToProto(status, response->add_pipelines());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace qpool::api
