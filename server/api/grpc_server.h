// GrpcServer: the gRPC server with qpool's services, health checking and reflection.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "api/access_control.h"
#include "api/inference_service.h"
#include "api/model_service.h"
#include "api/tls_file_mirror.h"
#include "api/watch_hub.h"
#include "pool/pipeline_pool.h"

namespace qpool::api {

// TLS on the gRPC port (Note [TLS files]); plaintext while cert_file is empty.
struct TlsOptions {
  std::string cert_file;  // PEM certificate chain
  std::string key_file;   // its PEM private key
  // PEM CA bundle; when set, clients must present a certificate it verifies (mTLS).
  std::string client_ca_file;
  // The three files are re-read this often; new connections get what they hold then.
  unsigned reload_seconds = 60;
};

struct GrpcServerOptions {
  std::string listen = "0.0.0.0:50051";
  int max_message_bytes = 64 << 20;
  // Open WatchMemory streams beyond this get RESOURCE_EXHAUSTED (Note [Watchers without
  // threads]): a dashboard or two per operator, with room to spare.
  size_t max_watchers = 256;
  TlsOptions tls;
  AccessOptions access;
  // Where qpool_denied_calls_total goes; may be null.
  MetricsRegistry* metrics = nullptr;
};

class GrpcServer {
 public:
  // How long a new connection may take over its TLS and HTTP/2 handshakes before it is closed.
  static constexpr int kHandshakeTimeoutMs = 10000;

  // Builds and starts the server on `pool` (which outlives it). Unavailable if the address
  // cannot be bound; InvalidArgument for TLS files or credentials that cannot work.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                     PipelinePool& pool);
  // The address actually bound (the port filled in when 0 was asked).
  const std::string& address() const { return address_; }
  // Marks every service SERVING (or NOT_SERVING) in grpc.health.v1; NOT_SERVING also ends the
  // WatchMemory streams (UNAVAILABLE) and refuses new ones until SERVING again.
  void SetServing(bool serving);
  // Marks every service NOT_SERVING, closes the port and lets the calls in flight finish until
  // `deadline`, then cancels the rest (a Generate stops at its next denoising step). Returns
  // when every call has finished (Note [Drain] in main.cpp).
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  GrpcServer(PipelinePool& pool, size_t max_watchers, std::unique_ptr<AccessControl> access,
             int max_message_bytes)
      : access_(std::move(access)),
        watchers_(pool.events(), max_watchers),
        inference_(pool, *access_, max_message_bytes),
        models_(pool, watchers_, *access_) {}
  const std::unique_ptr<AccessControl> access_;
  WatchHub watchers_;
  InferenceService inference_;
  ModelService models_;
  std::unique_ptr<TlsFileMirror> tls_mirror_;  // with TLS: the files gRPC serves
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace qpool::api
