// GrpcServer: the gRPC server with qpool's services, health checking and reflection.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "api/inference_service.h"
#include "api/model_service.h"
#include "pool/pipeline_pool.h"

namespace qpool::api {

struct GrpcServerOptions {
  std::string listen = "0.0.0.0:50051";
  int max_message_bytes = 64 << 20;
};

class GrpcServer {
 public:
  // Builds and starts the server on `pool` (which outlives it). Unavailable if the address
  // cannot be bound.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                     PipelinePool& pool);
  // The address actually bound (the port filled in when 0 was asked).
  const std::string& address() const { return address_; }
  // Marks every service SERVING (or NOT_SERVING) in grpc.health.v1.
  void SetServing(bool serving);
  // Marks every service NOT_SERVING, closes the port and lets the calls in flight finish until
  // `deadline`, then cancels the rest (a Generate stops at its next denoising step). Returns
  // when every call has finished (Note [Drain] in main.cpp).
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  explicit GrpcServer(PipelinePool& pool) : inference_(pool), models_(pool) {}
  InferenceService inference_;
  ModelService models_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace qpool::api
