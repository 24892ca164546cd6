#include "pool/request_recorder.h"

#include <utility>

#include "util/clock.h"

namespace qpool {
RequestRecorder::RequestRecorder(const RequestContext& context, RequestRpc rpc)
    : context_(context), rpc_(rpc), arrived_(std::chrono::steady_clock::now()) {}

void RequestRecorder::SetPipeline(const std::string& requested, const Status& acquired) {
  pipeline_ = RequestMetrics::PipelineLabel(requested, acquired);
}

void RequestRecorder::RunStarted(const c10::Device& device) {
  run_started_ = std::chrono::steady_clock::now();
  working_bytes_ = 0;
  if (!queued_recorded_) {
    queued_recorded_ = true;
    queue_seconds_ = std::chrono::duration<double>(run_started_ - arrived_).count();
    if (context_.requests != nullptr) {
      context_.requests->RecordQueued(pipeline_, rpc_, queue_seconds_);
    }
  }
  device_ = device;
  if (context_.memory != nullptr) {
    context_.memory->ResetPeak(device);
    at_start_ = context_.memory->Read(device);
  }
}

double RequestRecorder::seconds_since_arrival() const { return SecondsSince(arrived_); }

void RequestRecorder::RecordBatch(int size) {
  if (context_.requests != nullptr && device_) {
    context_.requests->RecordBatch(pipeline_, device_->str(), size);
  }
}

void RequestRecorder::RunEnded(const Status& status) {
  if (!device_) return;
  const DeviceMemoryStats after =
      context_.memory != nullptr ? context_.memory->Read(*device_) : DeviceMemoryStats{};
  if (status.code() == StatusCode::kResourceExhausted) AppendOomEvent(status, after);
  if (status.ok() && device_->is_cuda() && context_.memory != nullptr &&
      context_.requests != nullptr) {
    const uint64_t peak = after.peak_allocated_bytes;
    const uint64_t base = at_start_.allocated_bytes;
    working_bytes_ = peak > base ? peak - base : 0;
    context_.requests->RecordMemory(pipeline_, rpc_, device_->str(), peak, working_bytes_);
  }
}

void RequestRecorder::AppendOomEvent(const Status& status, const DeviceMemoryStats& after) {
  if (context_.events == nullptr) return;
  MemoryEvent e;
  e.kind = MemoryEventKind::kOom;
  e.pipeline = pipeline_;
  e.device = device_->str();
  e.allocated_before = at_start_.allocated_bytes;
  e.allocated_after = after.allocated_bytes;
  e.reserved_before = at_start_.reserved_bytes;
  e.reserved_after = after.reserved_bytes;
  e.duration_seconds = SecondsSince(run_started_);
  e.outcome = MemoryEventOutcome::kError;
  e.message = status.message();
  context_.events->Append(std::move(e));
}

void RequestRecorder::Finish(StatusCode code) {
  if (finished_) return;
  finished_ = true;
  if (context_.requests != nullptr) {
    context_.requests->RecordFinished(pipeline_, rpc_, code, SecondsSince(arrived_));
  }
}

}  // namespace qpool
