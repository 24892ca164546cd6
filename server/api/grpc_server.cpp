#include "api/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "grpc/health/v1/health.pb.h"
#include "util/log.h"

namespace qpool::api {

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& options,
                                                        PipelinePool& pool) {
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's health service carries no descriptor; reflection describes grpc.health.v1.Health
  // from the generated pool, which holds health.proto once its code is linked in.
  grpc::health::v1::HealthCheckResponse::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::unique_ptr<GrpcServer> server(new GrpcServer(pool, options.max_watchers));
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEPORT by default, so a second server on a port in use would start and
  // clients would reach either at random: refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(&server->inference_);
  builder.RegisterService(&server->models_);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || port == 0) {
    return Unavailable(
        StrCat("cannot listen on ", options.listen, " (address in use or invalid?)"));
  }
  const auto colon = options.listen.rfind(':');
  server->address_ = options.listen.substr(0, colon) + ":" + std::to_string(port);
  server->SetServing(false);
  return server;
}

void GrpcServer::SetServing(bool serving) {
  if (serving) {
    watchers_.Open();
  } else {
    watchers_.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "the server is draining before it stops; watch another replica"));
  }
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
    for (const char* service : {"qpool.v1.InferenceService", "qpool.v1.ModelService"}) {
      health->SetServingStatus(service, serving);
    }
  }
}

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  SetServing(false);  // also ends every WatchMemory stream, which gRPC would otherwise wait for
  server_->Shutdown(deadline);
}

}  // namespace qpool::api
