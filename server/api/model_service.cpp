#include "api/model_service.h"

#include "api/proto_convert.h"
#include "api/watch_memory_reactor.h"
#include "pool/pipeline_loader.h"

namespace qpool::api {

void ModelService::RunInTurn(std::vector<c10::Device> devices, grpc::ServerUnaryReactor* reactor,
                             DevicePool::Step step, std::function<void()> finish) {
  engine_.devices->RunInTurn(std::move(devices), std::move(step),
                             [reactor, finish = std::move(finish)](const Status& status) {
                               if (status.ok() && finish) finish();
                               reactor->Finish(ToGrpc(status));
                             });
}

grpc::ServerUnaryReactor* ModelService::ListPipelines(grpc::CallbackServerContext* context,
                                                      const v1::ListPipelinesRequest* request,
                                                      v1::ListPipelinesResponse* response) {
  for (const auto& status : engine_.registry->List()) ToProto(status, response->add_pipelines());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::LoadPipeline(grpc::CallbackServerContext* context,
                                                     const v1::LoadPipelineRequest* request,
                                                     v1::LoadPipelineResponse* response) {
  auto* reactor = context->DefaultReactor();
  const std::string name = request->name();
  auto devices = engine_.registry->PlanLoad(name, request->device());
  if (!devices.ok()) {
    reactor->Finish(ToGrpc(devices.status()));
    return reactor;
  }
  if (devices->empty()) {  // loaded already, where it was asked for
    response->set_already_loaded(true);
    if (auto status = engine_.registry->LoadedStatus(name)) {
      ToProto(*status, response->mutable_pipeline());
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // One replica per device, each loaded on its own worker, after whatever host memory needs
  // unloaded (Note [Host memory budget]).
  auto seconds = std::make_shared<double>(0);
  LoadReplicas(
      *engine_.registry, *engine_.devices, name, *devices,
      [response, seconds](const LoadResult& result) {
        ToProto(result.pipeline, response->mutable_pipeline());
        *seconds += result.load_seconds;
      },
      [reactor, response, seconds](const Status& status) {
        if (status.ok()) response->set_load_seconds(*seconds);
        reactor->Finish(ToGrpc(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::UnloadPipeline(grpc::CallbackServerContext* context,
                                                       const v1::UnloadPipelineRequest* request,
                                                       v1::UnloadPipelineResponse* response) {
  auto* reactor = context->DefaultReactor();
  const std::string name = request->name();
  // Each replica unloads on its device's worker: its frees are ordered after its last request
  // and nothing else allocates there during the leak check (Note [Leak check]).
  auto devices = engine_.registry->BeginUnload(name);
  if (!devices.ok()) {
    reactor->Finish(ToGrpc(devices.status()));
    return reactor;
  }
  response->set_name(name);
  engine_.devices->RunInTurn(
      *devices,
      [this, response, name](const c10::Device& device) -> Status {
        ASSIGN_OR_RETURN(UnloadResult result, engine_.registry->Unload(name, device));
        response->set_freed_bytes(response->freed_bytes() + result.freed_bytes);
        response->set_leaked_bytes(response->leaked_bytes() + result.leaked_bytes);
        return Status::Ok();
      },
      [this, reactor, name](const Status& status) {
        engine_.registry->EndUnload(name);
        reactor->Finish(ToGrpc(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::GetMemoryReport(grpc::CallbackServerContext* context,
                                                        const v1::GetMemoryReportRequest* request,
                                                        v1::MemoryReport* response) {
  const auto attributed = engine_.registry->AttributedBytes();
  for (const auto& stats : engine_.memory->ReadAll(engine_.devices->devices())) {
    auto* d = response->add_devices();
    ToProto(stats, d);
    auto it = attributed.find(stats.device);
    d->set_pipeline_bytes(it == attributed.end() ? 0 : it->second);
  }
  for (const auto& status : engine_.registry->ListLoaded()) {
    ToProto(status, response->add_pipelines());
  }
  response->set_pinned_host_bytes(engine_.memory->pinned_bytes());
  response->set_leaked_bytes_total(engine_.registry->leaked_bytes_total());
  const uint64_t first = engine_.events->first_available();
  for (const auto& e : engine_.events->Recent(std::min<uint32_t>(request->max_events(), 4096))) {
    ToProto(e, first, response->add_events());
  }
  response->set_last_sequence(engine_.events->last_sequence());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::MemoryEvent>* ModelService::WatchMemory(
    grpc::CallbackServerContext* context, const v1::WatchMemoryRequest* request) {
  return new WatchMemoryReactor(*engine_.events, request->after_sequence(), engine_.draining);
}

}  // namespace qpool::api
