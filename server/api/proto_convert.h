// Conversions between protobuf messages and engine types; the only place they meet.
#pragma once

#include <grpcpp/grpcpp.h>

#include "api/request_convert.h"
#include "memory/device_memory.h"
#include "memory/memory_event.h"
#include "pipeline/generate_request.h"
#include "pool/pipeline_pool.h"
#include "qpool/v1/qpool.pb.h"
#include "util/status.h"

namespace qpool::api {

// Engine status -> gRPC status, message unchanged.
grpc::Status ToGrpc(const Status& status);

void ToProto(const PipelineStatus& status, v1::PipelineInfo* out);
void ToProto(const DeviceMemoryStats& stats, v1::DeviceMemory* out);
void ToProto(const LoadStages& stages, v1::LoadStages* out);
// `first_available` is the oldest sequence the log still holds.
void ToProto(const MemoryEvent& event, uint64_t first_available, v1::MemoryEvent* out);
void ToProto(const ResidencyReport& report, v1::ResidencyChange* out);
void ToProto(GenerateReply reply, v1::GenerateResult* out);
void ToProto(const MemoryBreakdown& breakdown, v1::MemoryBreakdown* out);
void ToProto(const MemoryReport& report, v1::MemoryReport* out);
// Copies a CPU tensor (float32, float16, bfloat16 or int64) into a Tensor message.
void ToProto(const torch::Tensor& tensor, v1::Tensor* out);

}  // namespace qpool::api
