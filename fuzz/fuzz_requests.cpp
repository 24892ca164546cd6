// fuzz_requests: the protobuf edge. The input is parsed as each request message of
// proto/qpool/v1/qpool.proto with ParseFromArray and with the server's own parse of a raw call's
// bytes (api::ParseRaw, Note [Requests that do not parse] in api/raw_call.h), which must agree; a
// message that parses must serialize and parse back to the same bytes, and then goes through the
// checks the server runs on it before any LibTorch code:
//   GenerateRequest      -> native request (api::FromProto) -> ResolveGenerateRequest
//                           against an sd, an sdxl and a flux pipeline's manifest
//   EncodeRequest        -> ValidateEncodePrompts
//   requests naming a pipeline -> ValidatePipelineName
//   SetOffloadPolicyRequest -> MakeOffloadPolicy
// Every error they return is turned into a reply as api::ToGrpc does (SanitizeUtf8 of the
// message), which must be valid UTF-8. What the server does next (routing, loading, DevicePool's
// device names) needs LibTorch and is not fuzzed here.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/impl/grpc_library.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "api/raw_call.h"
#include "api/request_convert.h"
#include "config/manifest.h"
#include "config/model_repository.h"
#include "config/offload_policy.h"
#include "fuzz_check.h"
#include "pipeline/generate_request.h"
#include "pipeline/tokenizer/utf8.h"
#include "qpool/v1/qpool.pb.h"

namespace qpool::fuzz {
namespace {

// A manifest of `kind` as a pipeline folder called "tiny" would hold (docs/model-repository.md),
// with the request features its PipelineKind passes to ResolveGenerateRequest.
struct Pipeline {
  PipelineManifest manifest;
  RequestFeatures features;
};

std::vector<Pipeline> MakePipelines() {
  std::vector<Pipeline> pipelines(3);
  for (Pipeline& p : pipelines) p.manifest.name = "tiny";
  pipelines[0].manifest.kind = "sd";
  pipelines[0].manifest.limits.max_width = 256;
  pipelines[0].manifest.limits.max_height = 256;
  pipelines[0].manifest.defaults.width = 64;
  pipelines[0].manifest.defaults.height = 64;
  pipelines[1].manifest.kind = "sdxl";  // SdxlKind: size conditioning
  pipelines[1].features.size_conditioning = true;
  pipelines[2].manifest.kind = "flux";  // FluxKind: embedded guidance, flow matching, 2x2 patches
  pipelines[2].manifest.latent.channels = 16;
  pipelines[2].manifest.defaults.scheduler = SamplerNames(ScheduleFamily::kFlowMatch).front();
  pipelines[2].manifest.defaults.guidance_scale = 3.5;
  pipelines[2].features.embedded_guidance = true;
  pipelines[2].features.schedule = ScheduleFamily::kFlowMatch;
  pipelines[2].features.size_multiple = 2 * pipelines[2].manifest.latent.downscale;
  return pipelines;
}

// What a client would read for `status`: api::ToGrpc keeps the code and sanitizes the message.
void CheckReply(const Status& status) {
  if (status.ok()) return;
  FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument, status.ToString());
  const std::string message = SanitizeUtf8(status.message());
  FUZZ_CHECK(SanitizeUtf8(message) == message, "a reply message that is not valid UTF-8");
}

// A request's bytes as gRPC hands them to a raw method, here in three slices so that parsing
// crosses slice boundaries as it does for a message that arrived in several pieces.
grpc::ByteBuffer RawRequest(const uint8_t* data, size_t size) {
  const size_t a = size / 3;
  const size_t b = 2 * size / 3;
  grpc::Slice slices[] = {grpc::Slice(data, a), grpc::Slice(data + a, b - a),
                          grpc::Slice(data + b, size - b)};
  return grpc::ByteBuffer(slices, 3);
}

// Parses the input as `Message` with ParseFromArray and with api::ParseRaw: both must take or
// refuse it, refusals are INVALID_ARGUMENT with a valid UTF-8 message, and what parses must
// serialize and parse back to the same bytes.
template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* message) {
  const std::string type = message->GetTypeName();
  const bool parsed = message->ParseFromArray(data, static_cast<int>(size));
  Message raw;
  const grpc::Status status = api::ParseRaw(RawRequest(data, size), &raw);
  FUZZ_CHECK(status.ok() == parsed, type + ": ParseRaw and ParseFromArray disagree");
  if (!parsed) {
    FUZZ_CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT, status.error_message());
    FUZZ_CHECK(SanitizeUtf8(status.error_message()) == status.error_message(),
               "a parse error that is not valid UTF-8");
    return false;
  }
  const std::string bytes = message->SerializeAsString();
  FUZZ_CHECK(raw.SerializeAsString() == bytes, type + ": ParseRaw read another message");
  Message again;
  FUZZ_CHECK(again.ParseFromString(bytes), type + " does not parse back");
  FUZZ_CHECK(again.SerializeAsString() == bytes, type + " round trip");
  return true;
}

// The registry checks every name a client sends before it looks anything up; the error quotes
// the name, made printable.
void CheckName(const std::string& name) {
  const Status status = ValidatePipelineName(name);
  CheckReply(status);
  for (char c : status.message()) {
    FUZZ_CHECK(c >= 0x20 && c < 0x7f, "a name error that quotes unprintable bytes");
  }
}

void CheckGenerate(const v1::GenerateRequest& request, const std::vector<Pipeline>& pipelines) {
  const GenerateRequestIn in = api::FromProto(request);
  CheckName(in.pipeline);
  for (const Pipeline& pipeline : pipelines) {
    const PipelineManifest& m = pipeline.manifest;
    const StatusOr<GenerateParams> p = ResolveGenerateRequest(in, m, pipeline.features);
    CheckReply(p.status());
    if (!p.ok()) continue;
    FUZZ_CHECK(p->prompt.size() <= kMaxPromptBytes &&
                   p->negative_prompt.value_or("").size() <= kMaxPromptBytes,
               "prompt length");
    FUZZ_CHECK(p->steps >= 1 && p->steps <= m.limits.max_steps, "steps");
    const int multiple = pipeline.features.size_multiple;
    FUZZ_CHECK(p->width >= multiple && p->width % multiple == 0 && p->width <= m.limits.max_width,
               "width");
    FUZZ_CHECK(
        p->height >= multiple && p->height % multiple == 0 && p->height <= m.limits.max_height,
        "height");
    FUZZ_CHECK(p->num_images >= 1 && p->num_images <= m.limits.max_images, "num_images");
    FUZZ_CHECK(
        std::isfinite(p->guidance_scale) && p->guidance_scale >= 0 && p->guidance_scale <= 100,
        "guidance_scale");
    FUZZ_CHECK(
        std::isfinite(p->true_cfg_scale) && p->true_cfg_scale >= 0 && p->true_cfg_scale <= 100,
        "true_cfg_scale");
    const std::vector<std::string>& samplers = SamplerNames(pipeline.features.schedule);
    FUZZ_CHECK(std::find(samplers.begin(), samplers.end(), p->scheduler) != samplers.end(),
               "scheduler '" + p->scheduler + "'");
    FUZZ_CHECK(in.seed ? p->seed == *in.seed : p->seed < (uint64_t{1} << 53), "seed");
    const SizeConditioning& s = p->size;
    for (int v : {s.original_width, s.original_height, s.target_width, s.target_height}) {
      FUZZ_CHECK(v >= 1 && v <= kMaxConditioningSize, "size conditioning");
    }
    for (int v : {s.crop_top, s.crop_left}) {
      FUZZ_CHECK(v >= 0 && v <= kMaxConditioningSize, "crop");
    }
  }
}

void CheckEncode(const v1::EncodeRequest& request, const std::vector<Pipeline>& pipelines) {
  CheckName(request.pipeline());
  const std::vector<std::string> prompts(request.prompts().begin(), request.prompts().end());
  for (const Pipeline& pipeline : pipelines) {
    const Status status = ValidateEncodePrompts(prompts, pipeline.manifest);
    CheckReply(status);
    if (!status.ok()) continue;
    FUZZ_CHECK(!prompts.empty() &&
                   prompts.size() <= static_cast<size_t>(pipeline.manifest.limits.max_prompts),
               "prompt count");
    for (const std::string& prompt : prompts) {
      FUZZ_CHECK(prompt.size() <= kMaxPromptBytes, "prompt length");
    }
  }
}

void CheckPolicy(const v1::SetOffloadPolicyRequest& request) {
  CheckName(request.name());
  const StatusOr<OffloadPolicy> policy =
      MakeOffloadPolicy(request.policy().policy(), request.policy().idle_seconds());
  CheckReply(policy.status());
  if (!policy.ok()) return;
  FUZZ_CHECK(request.policy().policy() == OffloadModeName(policy->mode), "policy name");
  if (policy->mode == OffloadMode::kIdle) {
    FUZZ_CHECK(policy->idle_seconds > 0 && policy->idle_seconds <= kMaxIdleSeconds, "idle_seconds");
  }
}

}  // namespace
}  // namespace qpool::fuzz

// Sets up the gRPC library that ByteBuffer and Slice call into, as any gRPC++ program does.
static grpc::internal::GrpcLibraryInitializer grpc_library;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_library.summon();
  // A proto3 string field holding invalid UTF-8 fails the parse (as in the server) and logs an
  // error each time; thousands of those per second would only slow the run down.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  static const std::vector<fuzz::Pipeline> pipelines = fuzz::MakePipelines();

  if (v1::GenerateRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckGenerate(m, pipelines);
  if (v1::EncodeRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckEncode(m, pipelines);
  if (v1::LoadPipelineRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckName(m.name());
  if (v1::UnloadPipelineRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckName(m.name());
  if (v1::OffloadPipelineRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckName(m.name());
  if (v1::OnloadPipelineRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckName(m.name());
  if (v1::MovePipelineRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckName(m.name());
  if (v1::SetOffloadPolicyRequest m; fuzz::Parse(data, size, &m)) fuzz::CheckPolicy(m);
  // The parse alone: the server reads only numbers from these, or a device name (DevicePool,
  // with LibTorch).
  v1::ListPipelinesRequest list;
  v1::GetMemoryReportRequest memory_report;
  v1::WatchMemoryRequest watch_memory;
  v1::EmptyCacheRequest empty_cache;
  v1::GetAllocatorSnapshotRequest allocator_snapshot;
  fuzz::Parse(data, size, &list);
  fuzz::Parse(data, size, &memory_report);
  fuzz::Parse(data, size, &watch_memory);
  fuzz::Parse(data, size, &empty_cache);
  fuzz::Parse(data, size, &allocator_snapshot);
  return 0;
}
