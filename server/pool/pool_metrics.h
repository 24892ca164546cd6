// PoolMetrics: the /metrics families of the pool: the bytes each loaded pipeline's components
// hold and where, queue depth per device and pipeline, requests routed per device and reason,
// evictions and out-of-memory retries.
#pragma once

#include "metrics/metrics_registry.h"
#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"

namespace qpool {

// Reads the registry's counters and the workers' queues at each scrape (a collector), so the
// values are exact at scrape time and nothing is updated on the request path. Thread safety: as
// MetricsRegistry's collectors; the registry and pool outlive it.
class PoolMetrics {
 public:
  PoolMetrics(MetricsRegistry& metrics, PipelineRegistry& registry, DevicePool& devices);
  ~PoolMetrics();
  PoolMetrics(const PoolMetrics&) = delete;
  PoolMetrics& operator=(const PoolMetrics&) = delete;

 private:
  void Collect(SampleSink& sink) const;

  MetricsRegistry& metrics_;
  PipelineRegistry& registry_;
  DevicePool& devices_;
  MetricsRegistry::CollectorId collector_ = 0;
};

}  // namespace qpool
