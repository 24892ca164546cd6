#include "api/proto_convert.h"

#include "pipeline/tokenizer/utf8.h"

namespace qpool::api {

grpc::Status ToGrpc(const Status& status) {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (status.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kCancelled:
      code = grpc::StatusCode::CANCELLED;
      break;
    case StatusCode::kInvalidArgument:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case StatusCode::kPermissionDenied:
      code = grpc::StatusCode::PERMISSION_DENIED;
      break;
    case StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case StatusCode::kInternal:
      code = grpc::StatusCode::INTERNAL;
      break;
    case StatusCode::kUnauthenticated:
      code = grpc::StatusCode::UNAUTHENTICATED;
      break;
    case StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
  }
  return grpc::Status(code, SanitizeUtf8(status.message()));
}

void ToProto(const PipelineStatus& s, v1::PipelineInfo* out) {
  out->set_name(SanitizeUtf8(s.name));
  out->set_kind(SanitizeUtf8(s.kind));
  switch (s.state) {
    case PipelineState::kAvailable:
    case PipelineState::kLoading:
      out->set_state(v1::PIPELINE_STATE_AVAILABLE);
      break;
    case PipelineState::kLoaded:
      out->set_state(v1::PIPELINE_STATE_LOADED);
      break;
    case PipelineState::kFailed:
      out->set_state(v1::PIPELINE_STATE_FAILED);
      break;
  }
  out->set_device(SanitizeUtf8(s.device));
  out->set_error(SanitizeUtf8(s.error));
  out->set_in_flight(s.in_flight);
  for (const auto& c : s.components) {
    auto* info = out->add_components();
    info->set_name(SanitizeUtf8(c.name));
    info->set_device(SanitizeUtf8(c.device));
    info->set_dtype(SanitizeUtf8(c.dtype));
    info->set_quantization(SanitizeUtf8(c.quantization));
    info->set_weight_bytes(c.bytes.weight);
    info->set_quant_state_bytes(c.bytes.quant_state);
    info->set_other_bytes(c.bytes.other);
    info->set_graph_bytes(c.bytes.graph);
    info->set_residency(SanitizeUtf8(c.residency));
    info->set_host_bytes(c.host_bytes);
  }
  for (const auto& r : s.replicas) {
    auto* info = out->add_replicas();
    info->set_device(SanitizeUtf8(r.device));
    info->set_residency(SanitizeUtf8(r.residency));
    info->set_in_flight(r.in_flight);
    info->set_device_bytes(r.device_bytes);
    info->set_host_bytes(r.host_bytes);
  }
  out->set_max_queue(static_cast<uint32_t>(s.max_queue));
  out->set_max_batch(static_cast<uint32_t>(s.batching.max_batch));
  out->set_max_batch_delay_ms(s.batching.max_delay_ms);
  for (const auto& file : s.files_changed) out->add_files_changed(file);
  if (s.state == PipelineState::kLoaded) {
    out->mutable_offload_policy()->set_policy(OffloadModeName(s.policy.mode));
    out->mutable_offload_policy()->set_idle_seconds(s.policy.idle_seconds);
    if (s.policy.mode == OffloadMode::kSequential) {
      out->mutable_offload_policy()->set_group_mib(s.policy.stream.group_mib);
      out->mutable_offload_policy()->set_prefetch(static_cast<uint32_t>(s.policy.stream.prefetch));
      out->mutable_offload_policy()->set_resident_mib(s.policy.stream.resident_mib);
    }
  }
  // Defaults are the manifest's: none when it did not parse (no kind), rather than the built-in
  // values a reader would take for the pipeline's.
  if (!s.kind.empty()) {
    out->set_default_steps(static_cast<uint32_t>(s.defaults.steps));
    out->set_default_width(static_cast<uint32_t>(s.defaults.width));
    out->set_default_height(static_cast<uint32_t>(s.defaults.height));
  }
  for (const auto& name : s.schedulers) out->add_schedulers(name);
}

void ToProto(const LoadStages& s, v1::LoadStages* out) {
  out->set_verify_seconds(s.verify_seconds);
  out->set_read_seconds(s.read_seconds);
  out->set_read_bytes(s.read_bytes);
  out->set_quantize_seconds(s.quantize_seconds);
  out->set_pack_seconds(s.pack_seconds);
  out->set_device_seconds(s.device_seconds);
  out->set_warmup_seconds(s.warmup_seconds);
}

void ToProto(const DeviceMemoryStats& s, v1::DeviceMemory* out) {
  out->set_device(SanitizeUtf8(s.device));
  out->set_allocated_bytes(s.allocated_bytes);
  out->set_reserved_bytes(s.reserved_bytes);
  out->set_total_bytes(s.total_bytes);
  out->set_free_bytes(s.free_bytes);
  out->set_active_bytes(s.active_bytes);
  out->set_inactive_split_bytes(s.inactive_split_bytes);
  out->set_requested_bytes(s.requested_bytes);
  out->set_peak_allocated_bytes(s.peak_allocated_bytes);
  out->set_alloc_retries(s.alloc_retries);
  out->set_ooms(s.ooms);
}

void ToProto(const MemoryEvent& e, uint64_t first_available, v1::MemoryEvent* out) {
  out->set_sequence(e.sequence);
  out->set_unix_nanos(e.unix_nanos);
  out->set_kind(MemoryEventKindName(e.kind));
  out->set_pipeline(SanitizeUtf8(e.pipeline));
  out->set_component(SanitizeUtf8(e.component));
  out->set_device(SanitizeUtf8(e.device));
  out->set_from_device(SanitizeUtf8(e.from_device));
  out->set_to_device(SanitizeUtf8(e.to_device));
  out->set_allocated_before(e.allocated_before);
  out->set_allocated_after(e.allocated_after);
  out->set_reserved_before(e.reserved_before);
  out->set_reserved_after(e.reserved_after);
  out->set_attributed_delta_bytes(e.attributed_delta);
  out->set_duration_seconds(e.duration_seconds);
  out->set_outcome(MemoryEventOutcomeName(e.outcome));
  out->set_message(SanitizeUtf8(e.message));
  out->set_first_available_sequence(first_available);
  out->set_copied_bytes(e.copied_bytes);
}

void ToProto(const ResidencyReport& report, v1::ResidencyChange* out) {
  for (const auto& m : report.moves) {
    auto* move = out->add_moves();
    move->set_component(SanitizeUtf8(m.component));
    move->set_from(SanitizeUtf8(m.from));
    move->set_to(SanitizeUtf8(m.to));
    move->set_bytes(m.bytes);
    move->set_seconds(m.seconds);
    move->set_tensors_checked(static_cast<uint32_t>(m.tensors_checked));
  }
  out->set_bytes(out->bytes() + report.bytes);  // replicas change in turn: their sum
  out->set_seconds(out->seconds() + report.seconds);
}

void ToProto(GenerateReply reply, v1::GenerateResult* out) {
  for (auto& image : reply.images) {
    auto* i = out->add_images();
    i->set_png(std::move(image.png));
    i->set_width(static_cast<uint32_t>(image.width));
    i->set_height(static_cast<uint32_t>(image.height));
  }
  const GenerateParams& p = reply.params;
  out->set_seed(p.seed);
  out->set_device(reply.run.device);
  out->set_scheduler(p.scheduler);
  out->set_steps(static_cast<uint32_t>(p.steps));
  out->set_guidance_scale(static_cast<float>(p.guidance_scale));
  out->set_route(reply.run.route);
  out->set_attempts(static_cast<uint32_t>(reply.run.attempts));
  out->set_batch_size(static_cast<uint32_t>(reply.batch_size));
  auto* timings = out->mutable_timings();
  timings->set_queue_seconds(reply.run.queue_seconds);
  timings->set_encode_seconds(reply.timings.encode_seconds);
  timings->set_denoise_seconds(reply.timings.denoise_seconds);
  timings->set_decode_seconds(reply.timings.decode_seconds);
  timings->set_png_seconds(reply.timings.png_seconds);
  timings->set_total_seconds(reply.run.total_seconds);
}

void ToProto(const MemoryBreakdown& b, v1::MemoryBreakdown* out) {
  out->set_tensor_bytes(b.tensor_bytes);
  out->set_graph_pool_allocated_bytes(b.graph_pool_allocated_bytes);
  out->set_workspace_bytes(b.workspace_bytes);
  out->set_working_bytes(b.working_bytes);
  out->set_graph_pool_reserved_bytes(b.graph_pool_reserved_bytes);
  out->set_cached_bytes(b.cached_bytes);
  if (b.driver_process_bytes) out->set_driver_process_bytes(*b.driver_process_bytes);
  if (b.driver_used_bytes) out->set_driver_used_bytes(*b.driver_used_bytes);
  if (b.driver_total_bytes) out->set_driver_total_bytes(*b.driver_total_bytes);
  if (b.context_bytes) out->set_context_bytes(*b.context_bytes);
  if (b.outside_bytes) out->set_outside_allocator_bytes(*b.outside_bytes);
}

void ToProto(const MemoryReport& report, v1::MemoryReport* out) {
  for (const auto& device : report.devices) {
    auto* d = out->add_devices();
    ToProto(device.stats, d);
    d->set_pipeline_bytes(device.pipeline_bytes);
    if (device.breakdown) ToProto(*device.breakdown, d->mutable_breakdown());
  }
  for (const auto& status : report.pipelines) ToProto(status, out->add_pipelines());
  out->set_pinned_host_bytes(report.pinned_host_bytes);
  out->set_leaked_bytes_total(report.leaked_bytes_total);
  for (const auto& e : report.events) {
    ToProto(e, report.first_event_available, out->add_events());
  }
  out->set_last_sequence(report.last_sequence);
}

void ToProto(const torch::Tensor& tensor, v1::Tensor* out) {
  const torch::Tensor t = tensor.contiguous();
  switch (t.scalar_type()) {
    case torch::kFloat:
      out->set_dtype(v1::DTYPE_FLOAT32);
      break;
    case torch::kHalf:
      out->set_dtype(v1::DTYPE_FLOAT16);
      break;
    case torch::kBFloat16:
      out->set_dtype(v1::DTYPE_BFLOAT16);
      break;
    case torch::kLong:
      out->set_dtype(v1::DTYPE_INT64);
      break;
    default:
      out->set_dtype(v1::DTYPE_UNSPECIFIED);
      break;
  }
  for (int64_t d : t.sizes()) out->add_shape(d);
  out->set_data(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

}  // namespace qpool::api
