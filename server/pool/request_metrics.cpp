#include "pool/request_metrics.h"

#include <vector>

namespace qpool {
namespace {

// Diffusion requests take from milliseconds (an Encode, a refusal) to minutes (a large batch on
// a small GPU).
std::vector<double> DurationBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120};
}

// The same range, plus the sub-millisecond waits of an idle worker.
std::vector<double> QueueBuckets() {
  std::vector<double> buckets = {0.0005, 0.001, 0.0025};
  for (double b : DurationBuckets()) buckets.push_back(b);
  return buckets;
}

// 1 MiB, 2 MiB, ... 256 GiB: an Encode of a small model up to the largest GPUs.
std::vector<double> ByteBuckets() { return ExponentialBuckets(1 << 20, 2, 19); }

}  // namespace

const char* RequestRpcName(RequestRpc rpc) {
  switch (rpc) {
    case RequestRpc::kGenerate:
      return "generate";
    case RequestRpc::kEncode:
      return "encode";
  }
  return "unknown";
}

RequestMetrics::RequestMetrics(MetricsRegistry& metrics)
    : requests_(metrics.AddCounter("qpool_requests_total",
                                   "Generate and Encode requests by pipeline, RPC and gRPC status "
                                   "code, counted once when they end.",
                                   {"pipeline", "rpc", "status"})),
      durations_(metrics.AddHistogram("qpool_request_duration_seconds",
                                      "Wall time of requests from arrival to their end.",
                                      {"pipeline", "rpc", "status"}, DurationBuckets())),
      queue_(metrics.AddHistogram("qpool_request_queue_seconds",
                                  "Time requests waited for their device worker.",
                                  {"pipeline", "rpc"}, QueueBuckets())),
      peak_memory_(metrics.AddHistogram(
          "qpool_request_peak_memory_bytes",
          "Peak allocated GPU memory while a request ran (successful requests, CUDA only).",
          {"pipeline", "rpc", "device"}, ByteBuckets())),
      working_memory_(metrics.AddHistogram(
          "qpool_request_working_memory_bytes",
          "Peak allocated GPU memory of a request above what was allocated when it started "
          "(successful requests, CUDA only).",
          {"pipeline", "rpc", "device"}, ByteBuckets())),
      batch_sizes_(metrics.AddHistogram(
          "qpool_batch_size",
          "Generate requests per batch run (1 when a request ran alone; batching.max_batch).",
          {"pipeline", "device"}, {1, 2, 4, 8, 16, 32, 64})) {}

std::string RequestMetrics::PipelineLabel(const std::string& requested, const Status& acquired) {
  const StatusCode code = acquired.code();
  if (code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound) {
    return kUnknownPipeline;
  }
  return requested;
}

void RequestMetrics::RecordFinished(const std::string& pipeline, RequestRpc rpc, StatusCode code,
                                    double seconds) {
  const std::vector<std::string> labels = {pipeline, RequestRpcName(rpc), StatusCodeName(code)};
  requests_.WithLabels(labels).Inc();
  durations_.WithLabels(labels).Observe(seconds);
}

void RequestMetrics::RecordQueued(const std::string& pipeline, RequestRpc rpc, double seconds) {
  queue_.WithLabels({pipeline, RequestRpcName(rpc)}).Observe(seconds);
}

void RequestMetrics::RecordMemory(const std::string& pipeline, RequestRpc rpc,
                                  const std::string& device, uint64_t peak_bytes,
                                  uint64_t working_bytes) {
  const std::vector<std::string> labels = {pipeline, RequestRpcName(rpc), device};
  peak_memory_.WithLabels(labels).Observe(static_cast<double>(peak_bytes));
  working_memory_.WithLabels(labels).Observe(static_cast<double>(working_bytes));
}

void RequestMetrics::RecordBatch(const std::string& pipeline, const std::string& device, int size) {
  batch_sizes_.WithLabels({pipeline, device}).Observe(static_cast<double>(size));
}

void RequestMetrics::CreateSeries(const std::string& pipeline,
                                  const std::vector<std::string>& devices) {
  const std::string ok = StatusCodeName(StatusCode::kOk);
  for (RequestRpc rpc : {RequestRpc::kGenerate, RequestRpc::kEncode}) {
    const std::string name = RequestRpcName(rpc);
    requests_.WithLabels({pipeline, name, ok});
    durations_.WithLabels({pipeline, name, ok});
    queue_.WithLabels({pipeline, name});
    for (const std::string& device : devices) {
      if (device.rfind("cuda", 0) != 0) continue;  // measured on GPUs only (RequestRecorder)
      peak_memory_.WithLabels({pipeline, name, device});
      working_memory_.WithLabels({pipeline, name, device});
    }
  }
  for (const std::string& device : devices) batch_sizes_.WithLabels({pipeline, device});
}

void RequestMetrics::AddRunning(const std::string& pipeline, int delta) {
  std::lock_guard<std::mutex> lock(running_mu_);
  if ((running_[pipeline] += delta) == 0) running_.erase(pipeline);
}

std::map<std::string, int> RequestMetrics::Running() const {
  std::lock_guard<std::mutex> lock(running_mu_);
  return running_;
}

}  // namespace qpool
