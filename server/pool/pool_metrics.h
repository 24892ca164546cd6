// PoolMetrics: the /metrics families of the pool: the bytes each loaded pipeline's components
// hold and where, queue depth per device and pipeline, requests routed per device and reason,
// evictions and out-of-memory retries.
#pragma once

#include "metrics/metrics_registry.h"
#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"
#include "pool/request_metrics.h"

namespace qpool {

// Note [Load signals]
// What a router balancing qpool servers reads (docs/operations.md): per pipeline and for the
// whole server, the requests waiting (queued: handed to the pool and not yet running, batch
// queues included) and running (from their run's start on the device worker to its end, as
// RequestRun counts them), as qpool_pipeline_requests_waiting / _running and
// qpool_requests_waiting / _running. The server totals are the Gateway API Inference Extension's
// TotalQueuedRequests and TotalRunningRequests (vLLM's num_requests_waiting and
// num_requests_running); qpool_device_memory_free_bytes and _total_bytes stand for its cache
// utilization. Waiting is the pipeline's queue depth less its running requests, so the two are
// read at one instant.
//
// Reads the registry's counters and the workers' queues at each scrape (a collector), so the
// values are exact at scrape time and nothing is updated on the request path. At each scrape it
// also creates each loaded pipeline's request series at 0 (Note [Counters start at zero]).
// Thread safety: as MetricsRegistry's collectors; the registry and pool outlive it.
class PoolMetrics {
 public:
  // `requests` records into `metrics`; this creates the loaded pipelines' series in it.
  PoolMetrics(MetricsRegistry& metrics, PipelineRegistry& registry, DevicePool& devices,
              RequestMetrics& requests);
  ~PoolMetrics();
  PoolMetrics(const PoolMetrics&) = delete;
  PoolMetrics& operator=(const PoolMetrics&) = delete;

 private:
  void Collect(SampleSink& sink);
  void CollectLoadSignals(SampleSink& sink, const PoolCounters& counters);

  MetricsRegistry& metrics_;
  PipelineRegistry& registry_;
  DevicePool& devices_;
  RequestMetrics& requests_;
  MetricsRegistry::CollectorId collector_ = 0;
};

}  // namespace qpool
