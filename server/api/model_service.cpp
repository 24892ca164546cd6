#include "api/model_service.h"

#include "api/proto_convert.h"
#include "api/watch_memory_reactor.h"

namespace qpool::api {

grpc::ServerUnaryReactor* ModelService::ListPipelines(grpc::CallbackServerContext* context,
                                                      const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::ListPipelinesRequest, v1::ListPipelinesResponse>;
  return ServeUnary<v1::ListPipelinesRequest, v1::ListPipelinesResponse>(
      access_, CallClass::kRead, "ListPipelines", context, request, response, [this](Call* call) {
        for (const auto& status : pool_.List()) ToProto(status, call->response.add_pipelines());
        call->Finish(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* ModelService::LoadPipeline(grpc::CallbackServerContext* context,
                                                     const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::LoadPipelineRequest, v1::LoadPipelineResponse>;
  return ServeUnary<v1::LoadPipelineRequest, v1::LoadPipelineResponse>(
      access_, CallClass::kAdmin, "LoadPipeline", context, request, response, [this](Call* call) {
        pool_.Load(call->request.name(), call->request.device(),
                   [call](StatusOr<LoadResult> result) {
                     if (result.ok()) {
                       ToProto(result->pipeline, call->response.mutable_pipeline());
                       call->response.set_already_loaded(result->already_loaded);
                       call->response.set_load_seconds(result->load_seconds);
                       if (!result->already_loaded) {
                         ToProto(result->stages, call->response.mutable_stages());
                       }
                     }
                     call->Finish(ToGrpc(result.status()));
                   });
      });
}

grpc::ServerUnaryReactor* ModelService::UnloadPipeline(grpc::CallbackServerContext* context,
                                                       const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::UnloadPipelineRequest, v1::UnloadPipelineResponse>;
  return ServeUnary<v1::UnloadPipelineRequest, v1::UnloadPipelineResponse>(
      access_, CallClass::kAdmin, "UnloadPipeline", context, request, response, [this](Call* call) {
        call->response.set_name(call->request.name());
        pool_.Unload(call->request.name(), [call](StatusOr<UnloadResult> result) {
          if (result.ok()) {
            call->response.set_freed_bytes(result->freed_bytes);
            call->response.set_leaked_bytes(result->leaked_bytes);
          }
          call->Finish(ToGrpc(result.status()));
        });
      });
}

grpc::ServerUnaryReactor* ModelService::GetMemoryReport(grpc::CallbackServerContext* context,
                                                        const Raw* request, Raw* response) {
  using Call = UnaryCall<v1::GetMemoryReportRequest, v1::MemoryReport>;
  return ServeUnary<v1::GetMemoryReportRequest, v1::MemoryReport>(
      access_, CallClass::kRead, "GetMemoryReport", context, request, response, [this](Call* call) {
        ToProto(pool_.Memory(std::min<uint32_t>(call->request.max_events(), 4096)),
                &call->response);
        call->Finish(grpc::Status::OK);
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ModelService::WatchMemory(
    grpc::CallbackServerContext* context, const Raw* request) {
  grpc::Status allowed = access_.Check(*context, CallClass::kRead, "WatchMemory");
  if (!allowed.ok()) return new FinishedWriter(std::move(allowed));
  v1::WatchMemoryRequest parsed;
  grpc::Status status = ParseRaw(*request, &parsed);
  if (!status.ok()) return new FinishedWriter(std::move(status));
  // A sequence never issued (one from before a restart, say) would wait forever in silence.
  const uint64_t last = pool_.events().last_sequence();
  if (parsed.after_sequence() > last) {
    return new FinishedWriter(
        grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                     StrCat("after_sequence ", parsed.after_sequence(),
                            " is past the newest memory event, ", last,
                            " (from before the server restarted?): watch from 0 or from "
                            "GetMemoryReport's last_sequence")));
  }
  return new WatchMemoryReactor(watchers_, parsed.after_sequence());  // deletes itself
}

}  // namespace qpool::api
