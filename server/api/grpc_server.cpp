#include "api/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "grpc/health/v1/health.pb.h"
#include "util/listen_socket.h"
#include "util/log.h"
#include "util/tls_files.h"

namespace qpool::api {
namespace {

// Note [TLS files]
// The certificate, key and client CA are checked once at start-up (a wrong path, a key of another
// certificate or an encrypted key fails the start with the file named, instead of every handshake
// failing later), then mirrored (Note [TLS renewal] in api/tls_file_mirror.h) into the files
// gRPC's file-watching certificate provider serves: a renewed certificate (cert-manager rewriting
// a Secret, say) serves new connections within about reload_seconds without a restart, connections
// already open keep theirs, and a renewal that does not validate never reaches gRPC.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const TlsOptions& tls, MetricsRegistry* metrics, std::unique_ptr<TlsFileMirror>* mirror) {
  if (tls.cert_file.empty()) return grpc::InsecureServerCredentials();
  ASSIGN_OR_RETURN(const CertificateInfo info, CheckCertificateAndKey(tls.cert_file, tls.key_file));
  log::Info("TLS: certificate ", info.subject, ", valid until ", info.not_after, ", re-read every ",
            tls.reload_seconds, " s");
  if (!tls.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(const int authorities, CheckCertificateBundle(tls.client_ca_file));
    log::Info("mTLS: client certificates required, verified against ", authorities,
              " CA certificate(s) of ", tls.client_ca_file);
  }
  ASSIGN_OR_RETURN(*mirror, TlsFileMirror::Start({tls.cert_file, tls.key_file, tls.client_ca_file},
                                                 tls.reload_seconds, metrics));
  const TlsFileMirror::Files& files = (*mirror)->mirror();
  // The mirror changes only when the watcher validated a renewal: gRPC may look at it often.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.client_ca, 1);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& options,
                                                        PipelinePool& pool) {
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's health service carries no descriptor; reflection describes grpc.health.v1.Health
  // from the generated pool, which holds health.proto once its code is linked in.
  grpc::health::v1::HealthCheckResponse::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // A malformed address is the flag's error (exit 2); BuildAndStart only says it failed.
  RETURN_IF_ERROR(CheckListenAddress(options.listen, {"gRPC", "gRPC", 50051}));
  ASSIGN_OR_RETURN(auto access, AccessControl::Create(options.access, options.metrics));
  std::unique_ptr<TlsFileMirror> mirror;
  ASSIGN_OR_RETURN(auto credentials, Credentials(options.tls, options.metrics, &mirror));
  std::unique_ptr<GrpcServer> server(
      new GrpcServer(pool, options.max_watchers, std::move(access), options.max_message_bytes));
  server->tls_mirror_ = std::move(mirror);
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEPORT by default, so a second server on a port in use would start and
  // clients would reach either at random: refuse the port instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection that has not finished its HTTP/2 (and TLS) handshake within this is closed:
  // gRPC's default of 120 s let idle connections pile up, each an open descriptor.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.AddListeningPort(options.listen, credentials, &port);
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
