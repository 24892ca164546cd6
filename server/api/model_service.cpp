#include "api/model_service.h"

#include "api/proto_convert.h"
#include "api/watch_memory_reactor.h"

namespace qpool::api {

void ModelService::RunOn(const c10::Device& device, grpc::ServerUnaryReactor* reactor,
                         std::function<Status()> work) {
  Status submitted =
      engine_.devices->worker(device).Submit([reactor, work = std::move(work)](bool run) {
        if (!run) {
          reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down"));
          return;
        }
        reactor->Finish(ToGrpc(work()));
      });
  if (!submitted.ok()) reactor->Finish(ToGrpc(submitted));
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
  auto device = engine_.registry->PlanDevice(request->name(), request->device());
  if (!device.ok()) {
    reactor->Finish(ToGrpc(device.status()));
    return reactor;
  }
  const std::string name = request->name();
  const std::string wanted = request->device();  // Load resolves it again, same answer
  RunOn(*device, reactor, [this, response, name, wanted]() -> Status {
    ASSIGN_OR_RETURN(LoadResult result, engine_.registry->Load(name, wanted));
    ToProto(result.pipeline, response->mutable_pipeline());
    response->set_load_seconds(result.load_seconds);
    response->set_already_loaded(result.already_loaded);
    return Status::Ok();
  });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::UnloadPipeline(grpc::CallbackServerContext* context,
                                                       const v1::UnloadPipelineRequest* request,
                                                       v1::UnloadPipelineResponse* response) {
  auto* reactor = context->DefaultReactor();
  const std::string name = request->name();
  // Unload on the pipeline's worker: its frees are ordered after its last request and nothing
  // else allocates there during the leak check (Note [Leak check]).
  auto device = engine_.registry->ChangeTarget(name, PipelineRegistry::Change::kOffload, "");
  Status unloadable = device.ok() ? engine_.registry->CheckUnload(name) : device.status();
  if (!unloadable.ok()) {
    reactor->Finish(ToGrpc(unloadable));
    return reactor;
  }
  RunOn(*device, reactor, [this, response, name]() -> Status {
    ASSIGN_OR_RETURN(UnloadResult result, engine_.registry->Unload(name));
    response->set_name(name);
    response->set_freed_bytes(result.freed_bytes);
    response->set_leaked_bytes(result.leaked_bytes);
    return Status::Ok();
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
  return new WatchMemoryReactor(*engine_.events, request->after_sequence());
}

}  // namespace qpool::api
