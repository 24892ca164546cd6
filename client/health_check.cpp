#include "health_check.h"

#include "grpc/health/v1/health.grpc.pb.h"

namespace qpool::cli {

const char* ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kServing: return "SERVING";
    case ServingStatus::kNotServing: return "NOT_SERVING";
    case ServingStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
    default: return "UNKNOWN";
  }
}

grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
                         const std::string& service, ServingStatus* status) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status rpc_status =
      grpc::health::v1::Health::NewStub(channel)->Check(context, request, &response);
  if (!rpc_status.ok()) return rpc_status;
  *status = static_cast<ServingStatus>(response.status());
  return grpc::Status::OK;
}

}  // namespace qpool::cli
