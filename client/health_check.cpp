#include "health_check.h"

#include <grpcpp/generic/generic_stub.h>

#include <vector>

namespace qpool::cli {
namespace {

// Note [Hand-encoded health messages]
// HealthCheckRequest is `string service = 1;` and HealthCheckResponse is
// `ServingStatus status = 1;` (an enum, i.e. a varint). Encoding and decoding those two
// fields by hand costs a few lines; generating the health proto would need a .proto file
// that neither the repository nor Debian's gRPC packages ship.
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;  // proto3 omits empty strings
  out.push_back(static_cast<char>(0x0a));  // field 1, wire type 2 (length-delimited)
  for (uint64_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  return out + service;
}

bool ReadVarint(const std::string& data, size_t* pos, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *pos < data.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(data[(*pos)++]);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Finds field 1 (varint) in a HealthCheckResponse, skipping unknown fields.
bool DecodeResponse(const std::string& data, ServingStatus* status) {
  *status = ServingStatus::kUnknown;
  size_t pos = 0;
  while (pos < data.size()) {
    uint64_t key = 0;
    uint64_t value = 0;
    if (!ReadVarint(data, &pos, &key)) return false;
    switch (key & 7) {
      case 0:
        if (!ReadVarint(data, &pos, &value)) return false;
        if ((key >> 3) == 1) *status = static_cast<ServingStatus>(value);
        break;
      case 1: pos += 8; break;
      case 2:
        if (!ReadVarint(data, &pos, &value)) return false;
        pos += value;
        break;
      case 5: pos += 4; break;
      default: return false;
    }
  }
  return pos == data.size();
}

}  // namespace

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
  const std::string request = EncodeRequest(service);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::Status rpc_status;

  grpc::CompletionQueue cq;
  grpc::GenericStub stub(channel);
  auto call = stub.PrepareUnaryCall(context, "/grpc.health.v1.Health/Check", request_buffer, &cq);
  call->StartCall();
  call->Finish(&response_buffer, &rpc_status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) return grpc::Status(grpc::StatusCode::INTERNAL, "health call failed");
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!rpc_status.ok()) return rpc_status;

  std::vector<grpc::Slice> slices;
  std::string response;
  if (response_buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (!DecodeResponse(response, status)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "malformed HealthCheckResponse");
  }
  return grpc::Status::OK;
}

}  // namespace qpool::cli
