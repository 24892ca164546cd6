// grpc.health.v1.Health/Check (proto/grpc/health/v1/health.proto).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace qpool::cli {

// Serving status of grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// "SERVING", "NOT_SERVING", ...
const char* ServingStatusName(ServingStatus status);

// Calls grpc.health.v1.Health/Check for `service` ("" = the whole server) on `channel` with
// `context`; on success stores the answer in `status`.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                         const std::string& service, ServingStatus* status);

}  // namespace qpool::cli
