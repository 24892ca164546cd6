// RequestMetrics: the request families of /metrics (counts, durations, queue time and
// per-request device memory of Generate and Encode calls).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/metrics_registry.h"
#include "util/status.h"

namespace qpool {

// The RPCs that run a pipeline; their label values are "generate" and "encode".
enum class RequestRpc { kGenerate, kEncode };

// The `rpc` label value of `rpc`.
const char* RequestRpcName(RequestRpc rpc);

// Note [Request label values]
// Label values come only from bounded sets, so a client cannot create series: `rpc` and `status`
// (StatusCodeName: the gRPC code a call ends with) are enums, `device` is one of the pool's
// devices, and `pipeline` is a name the model repository holds, or kUnknownPipeline for any name it
// does not (invalid or not found).

// Registers the request families in the constructor; the Record* methods update them.
// Thread safety: every method may be called from any thread (series lookups take the family's
// mutex, updates are atomic).
class RequestMetrics {
 public:
  // The pipeline label of requests naming no pipeline of the model repository.
  static constexpr const char* kUnknownPipeline = "unknown";

  explicit RequestMetrics(MetricsRegistry& metrics);
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  // The pipeline label of a request for `requested`, given PipelineRegistry::Acquire's answer
  // for it: InvalidArgument (bad name) and NotFound (not in the repository) give
  // kUnknownPipeline, every other answer (OK, not loaded, moving) names a repository pipeline.
  static std::string PipelineLabel(const std::string& requested, const Status& acquired);

  // Counts one finished request and observes its duration (arrival to end).
  void RecordFinished(const std::string& pipeline, RequestRpc rpc, StatusCode code, double seconds);
  // Observes how long a request waited for its device worker.
  void RecordQueued(const std::string& pipeline, RequestRpc rpc, double seconds);
  // Observes a request's peak allocated bytes on `device` and its working memory (that peak
  // minus what was allocated when the request started).
  void RecordMemory(const std::string& pipeline, RequestRpc rpc, const std::string& device,
                    uint64_t peak_bytes, uint64_t working_bytes);
  // Observes the size (requests) of a Generate batch that ran on `device` (Note [Dynamic
  // batching]).
  void RecordBatch(const std::string& pipeline, const std::string& device, int size);
  // Creates, at zero, the series of loaded pipeline `pipeline` whose replicas are on `devices`
  // (Note [Counters start at zero] in pool_metrics.cpp): OK counts, OK durations and queue times
  // of both RPCs, batch sizes per device and, on CUDA devices, request memory. Series that
  // exist already keep their values.
  void CreateSeries(const std::string& pipeline, const std::vector<std::string>& devices);
  // Note [Load signals]: a run of a request of `pipeline` started (+1) or ended (-1), as
  // RequestRun counts them; Running() gives the requests running now per pipeline.
  void AddRunning(const std::string& pipeline, int delta);
  std::map<std::string, int> Running() const;

 private:
  mutable std::mutex running_mu_;
  std::map<std::string, int> running_;  // guarded by running_mu_
  CounterFamily& requests_;
  HistogramFamily& durations_;
  HistogramFamily& queue_;
  HistogramFamily& peak_memory_;
  HistogramFamily& working_memory_;
  HistogramFamily& batch_sizes_;
};

}  // namespace qpool
