#include "api/model_service.h"

#include "api/proto_convert.h"
#include "api/watch_memory_reactor.h"

namespace qpool::api {

grpc::ServerUnaryReactor* ModelService::ListPipelines(grpc::CallbackServerContext* context,
                                                      const v1::ListPipelinesRequest* request,
                                                      v1::ListPipelinesResponse* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kRead, "ListPipelines");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  for (const auto& status : pool_.List()) ToProto(status, response->add_pipelines());
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::LoadPipeline(grpc::CallbackServerContext* context,
                                                     const v1::LoadPipelineRequest* request,
                                                     v1::LoadPipelineResponse* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "LoadPipeline");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  auto* reactor = context->DefaultReactor();
  pool_.Load(request->name(), request->device(), [reactor, response](StatusOr<LoadResult> result) {
    if (result.ok()) {
      ToProto(result->pipeline, response->mutable_pipeline());
      response->set_already_loaded(result->already_loaded);
      response->set_load_seconds(result->load_seconds);
    }
    reactor->Finish(ToGrpc(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::UnloadPipeline(grpc::CallbackServerContext* context,
                                                       const v1::UnloadPipelineRequest* request,
                                                       v1::UnloadPipelineResponse* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kAdmin, "UnloadPipeline");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  auto* reactor = context->DefaultReactor();
  response->set_name(request->name());
  pool_.Unload(request->name(), [reactor, response](StatusOr<UnloadResult> result) {
    if (result.ok()) {
      response->set_freed_bytes(result->freed_bytes);
      response->set_leaked_bytes(result->leaked_bytes);
    }
    reactor->Finish(ToGrpc(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ModelService::GetMemoryReport(grpc::CallbackServerContext* context,
                                                        const v1::GetMemoryReportRequest* request,
                                                        v1::MemoryReport* response) {
  grpc::Status allowed = access_.Check(*context, CallClass::kRead, "GetMemoryReport");
  if (!allowed.ok()) return FinishedWith(context, std::move(allowed));
  ToProto(pool_.Memory(std::min<uint32_t>(request->max_events(), 4096)), response);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::MemoryEvent>* ModelService::WatchMemory(
    grpc::CallbackServerContext* context, const v1::WatchMemoryRequest* request) {
  grpc::Status allowed = access_.Check(*context, CallClass::kRead, "WatchMemory");
  if (!allowed.ok()) return new FinishedWriter<v1::MemoryEvent>(std::move(allowed));
  return new WatchMemoryReactor(watchers_, request->after_sequence());  // deletes itself
}

}  // namespace qpool::api
