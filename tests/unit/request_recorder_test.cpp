// RequestRecorder: one count per request, queue time, per-request GPU memory from the allocator's
// peak, and an `oom` memory event when a run fails for lack of memory. A scripted DeviceMemory
// stands in for the GPU.
#include "pool/request_recorder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "memory/arena_allocator.h"
#include "testing/metric_samples.h"

namespace qpool {
namespace {

using ::qpool::testing::SampleValue;

constexpr uint64_t kGiB = 1ull << 30;

// Answers Read with scripted stats, in order, and counts ResetPeak calls.
class ScriptedMemory final : public DeviceMemory {
 public:
  explicit ScriptedMemory(const ArenaAllocator& arenas) : DeviceMemory(arenas) {}

  DeviceMemoryStats Read(const c10::Device& device) const override {
    DeviceMemoryStats stats;
    if (!reads_.empty()) {
      stats = reads_.front();
      reads_.pop_front();
    }
    stats.device = device.str();
    return stats;
  }
  void ResetPeak(const c10::Device& device) const override { ++resets_; }

  // The next Read answers `allocated`, `reserved` and `peak` bytes.
  void Script(uint64_t allocated, uint64_t reserved, uint64_t peak) {
    DeviceMemoryStats stats;
    stats.allocated_bytes = allocated;
    stats.reserved_bytes = reserved;
    stats.peak_allocated_bytes = peak;
    reads_.push_back(stats);
  }
  int resets() const { return resets_; }

 private:
  mutable std::deque<DeviceMemoryStats> reads_;
  mutable int resets_ = 0;
};

class RequestRecorderTest : public ::testing::Test {
 protected:
  RequestContext Engine() {
    RequestContext engine;
    engine.memory = &memory_;
    engine.events = &events_;
    engine.requests = &requests_;
    return engine;
  }

  const c10::Device gpu_{c10::kCUDA, 0};
  const c10::Device cpu_{c10::kCPU};
  ArenaAllocator arenas_;
  ScriptedMemory memory_{arenas_};
  MemoryEventLog events_;
  MetricsRegistry registry_;
  RequestMetrics requests_{registry_};
};

TEST_F(RequestRecorderTest, SuccessfulGpuRunObservesPeakAndWorkingMemory) {
  RequestRecorder recorder(Engine(), RequestRpc::kGenerate);
  recorder.SetPipeline("tiny", Status::Ok());
  memory_.Script(/*allocated=*/1 * kGiB, /*reserved=*/2 * kGiB, /*peak=*/1 * kGiB);
  recorder.RunStarted(gpu_);
  EXPECT_EQ(memory_.resets(), 1);
  EXPECT_GE(recorder.queue_seconds(), 0);
  memory_.Script(1 * kGiB, 4 * kGiB, /*peak=*/3 * kGiB);
  recorder.RunEnded(Status::Ok());
  recorder.Finish(StatusCode::kOk);
  recorder.Finish(StatusCode::kInternal);  // ignored: a request is counted once

  const MetricLabels memory = {{"pipeline", "tiny"}, {"rpc", "generate"}, {"device", "cuda:0"}};
  EXPECT_EQ(SampleValue(registry_, "qpool_request_peak_memory_bytes_sum", memory), 3.0 * kGiB);
  EXPECT_EQ(SampleValue(registry_, "qpool_request_working_memory_bytes_sum", memory), 2.0 * kGiB);
  EXPECT_EQ(SampleValue(registry_, "qpool_request_queue_seconds_count",
                        {{"pipeline", "tiny"}, {"rpc", "generate"}}),
            1);
  EXPECT_EQ(SampleValue(registry_, "qpool_requests_total",
                        {{"pipeline", "tiny"}, {"rpc", "generate"}, {"status", "OK"}}),
            1);
  EXPECT_TRUE(
      std::isnan(SampleValue(registry_, "qpool_requests_total",
                             {{"pipeline", "tiny"}, {"rpc", "generate"}, {"status", "INTERNAL"}})));
  EXPECT_EQ(events_.last_sequence(), 0u);
}

TEST_F(RequestRecorderTest, OutOfMemoryIsAnOomEventAndNotAMemoryObservation) {
  RequestRecorder recorder(Engine(), RequestRpc::kGenerate);
  recorder.SetPipeline("tiny", Status::Ok());
  memory_.Script(1 * kGiB, 2 * kGiB, 1 * kGiB);
  recorder.RunStarted(gpu_);
  memory_.Script(1 * kGiB + 4096, 6 * kGiB, 5 * kGiB);
  recorder.RunEnded(ResourceExhausted("component 'unet' failed: CUDA out of memory"));
  recorder.Finish(StatusCode::kResourceExhausted);

  const std::vector<MemoryEvent> events = events_.Since(0);
  ASSERT_EQ(events.size(), 1u);
  const MemoryEvent& e = events[0];
  EXPECT_EQ(e.kind, MemoryEventKind::kOom);
  EXPECT_EQ(e.outcome, MemoryEventOutcome::kError);
  EXPECT_EQ(e.pipeline, "tiny");
  EXPECT_EQ(e.device, "cuda:0");
  EXPECT_EQ(e.allocated_before, 1 * kGiB);
  EXPECT_EQ(e.allocated_after, 1 * kGiB + 4096);
  EXPECT_EQ(e.reserved_before, 2 * kGiB);
  EXPECT_EQ(e.reserved_after, 6 * kGiB);
  EXPECT_EQ(e.message, "component 'unet' failed: CUDA out of memory");
  EXPECT_GE(e.duration_seconds, 0);
  EXPECT_TRUE(
      std::isnan(SampleValue(registry_, "qpool_request_peak_memory_bytes_count",
                             {{"pipeline", "tiny"}, {"rpc", "generate"}, {"device", "cuda:0"}})));
  EXPECT_EQ(
      SampleValue(registry_, "qpool_requests_total",
                  {{"pipeline", "tiny"}, {"rpc", "generate"}, {"status", "RESOURCE_EXHAUSTED"}}),
      1);
}

TEST_F(RequestRecorderTest, CpuRunsAndOtherFailuresLeaveNoMemoryTrace) {
  RequestRecorder ok(Engine(), RequestRpc::kEncode);
  ok.SetPipeline("tiny", Status::Ok());
  ok.RunStarted(cpu_);
  ok.RunEnded(Status::Ok());
  ok.Finish(StatusCode::kOk);
  RequestRecorder failed(Engine(), RequestRpc::kEncode);
  failed.SetPipeline("tiny", Status::Ok());
  failed.RunStarted(gpu_);
  failed.RunEnded(Internal("component 'text_encoder' failed"));
  failed.Finish(StatusCode::kInternal);

  EXPECT_EQ(events_.last_sequence(), 0u);
  for (const FamilySnapshot& family : registry_.Collect()) {
    EXPECT_EQ(family.name.find("memory"), std::string::npos) << family.name;
  }
  EXPECT_EQ(SampleValue(registry_, "qpool_request_queue_seconds_count",
                        {{"pipeline", "tiny"}, {"rpc", "encode"}}),
            2);
}

TEST_F(RequestRecorderTest, RefusedRequestsCountUnderTheirLabelWithoutQueueTime) {
  RequestRecorder unknown(Engine(), RequestRpc::kGenerate);
  unknown.SetPipeline("no-such-pipeline", NotFound("no pipeline named 'no-such-pipeline'"));
  unknown.Finish(StatusCode::kNotFound);
  RequestRecorder not_loaded(Engine(), RequestRpc::kEncode);
  not_loaded.SetPipeline("spare", FailedPrecondition("pipeline 'spare' is not loaded"));
  not_loaded.Finish(StatusCode::kFailedPrecondition);
  // Before SetPipeline (nothing known about the request yet) the label is "unknown" too.
  RequestRecorder early(Engine(), RequestRpc::kGenerate);
  early.Finish(StatusCode::kUnavailable);

  EXPECT_EQ(SampleValue(registry_, "qpool_requests_total",
                        {{"pipeline", "unknown"}, {"rpc", "generate"}, {"status", "NOT_FOUND"}}),
            1);
  EXPECT_EQ(
      SampleValue(registry_, "qpool_requests_total",
                  {{"pipeline", "spare"}, {"rpc", "encode"}, {"status", "FAILED_PRECONDITION"}}),
      1);
  EXPECT_EQ(SampleValue(registry_, "qpool_requests_total",
                        {{"pipeline", "unknown"}, {"rpc", "generate"}, {"status", "UNAVAILABLE"}}),
            1);
  for (const FamilySnapshot& family : registry_.Collect()) {
    EXPECT_NE(family.name, "qpool_request_queue_seconds");
  }
  EXPECT_EQ(memory_.resets(), 0);
}

TEST_F(RequestRecorderTest, WorksWithoutMetricsMemoryOrEvents) {
  RequestRecorder recorder(RequestContext{}, RequestRpc::kGenerate);
  recorder.SetPipeline("tiny", Status::Ok());
  recorder.RunStarted(gpu_);
  recorder.RunEnded(ResourceExhausted("out of memory"));
  recorder.Finish(StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_.Collect().size(), 0u);
  EXPECT_EQ(events_.last_sequence(), 0u);
}

}  // namespace
}  // namespace qpool
