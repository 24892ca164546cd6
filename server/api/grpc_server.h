// GrpcServer: the gRPC server with qpool's services, health checking and reflection.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "api/inference_service.h"
#include "api/model_service.h"
#include "api/watch_hub.h"
#include "pool/pipeline_pool.h"

namespace qpool::api {

struct GrpcServerOptions {
  std::string listen = "0.0.0.0:50051";
  int max_message_bytes = 64 << 20;
  // Open WatchMemory streams beyond this get RESOURCE_EXHAUSTED (Note [Watchers without
  // threads]): a dashboard or two per operator, with room to spare.
  size_t max_watchers = 256;
};

class GrpcServer {
 public:
  // Builds and starts the server on `pool` (which outlives it). Unavailable if the address
  // cannot be bound.
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
  GrpcServer(PipelinePool& pool, size_t max_watchers)
      : watchers_(pool.events(), max_watchers), inference_(pool), models_(pool, watchers_) {}
  WatchHub watchers_;
  InferenceService inference_;
  ModelService models_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace qpool::api
