#include "pool/pool_metrics.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace qpool {

PoolMetrics::PoolMetrics(MetricsRegistry& metrics, PipelineRegistry& registry, DevicePool& devices,
                         RequestMetrics& requests)
    : metrics_(metrics), registry_(registry), devices_(devices), requests_(requests) {
  collector_ = metrics.AddCollector([this](SampleSink& sink) { Collect(sink); });
}

PoolMetrics::~PoolMetrics() { metrics_.RemoveCollector(collector_); }

// Note [Load signals].
void PoolMetrics::CollectLoadSignals(SampleSink& sink, const PoolCounters& c) {
  const std::map<std::string, int> running = requests_.Running();
  std::map<std::string, std::pair<int, int>> load;  // pipeline: waiting, running
  for (const auto& p : registry_.ListLoaded()) load[p.name];
  for (const auto& [pipeline, n] : running) load[pipeline].second = n;
  for (const auto& [pipeline, queued] : c.queued) {
    auto& [waiting, runs] = load[pipeline];
    waiting = std::max(0, static_cast<int>(queued) - runs);
  }
  int total_waiting = 0, total_running = 0;
  for (const auto& [pipeline, n] : load) {
    sink.AddGauge("qpool_pipeline_requests_waiting",
                  "Requests of the pipeline handed to the pool and not yet running.",
                  {{"pipeline", pipeline}}, n.first);
    sink.AddGauge("qpool_pipeline_requests_running",
                  "Requests of the pipeline running on a device worker.", {{"pipeline", pipeline}},
                  n.second);
    total_waiting += n.first;
    total_running += n.second;
  }
  sink.AddGauge("qpool_requests_waiting",
                "Requests handed to the pool and not yet running, every pipeline (a router's "
                "queue signal).",
                {}, total_waiting);
  sink.AddGauge("qpool_requests_running", "Requests running on device workers, every pipeline.", {},
                total_running);
}

void PoolMetrics::Collect(SampleSink& sink) {
  for (const auto& device : devices_.devices()) {
    sink.AddGauge("qpool_device_queue_depth",
                  "Tasks (requests, loads, moves) waiting or running on the device's worker.",
                  {{"device", device.str()}},
                  static_cast<double>(devices_.worker(device).pending()));
  }
  const PoolCounters c = registry_.Counters();
  for (const auto& [pipeline, queued] : c.queued) {
    sink.AddGauge("qpool_pipeline_queue_depth",
                  "Requests of the pipeline queued or running, all replicas (limits.max_queue "
                  "bounds it).",
                  {{"pipeline", pipeline}}, static_cast<double>(queued));
  }
  CollectLoadSignals(sink, c);
  for (const auto& [key, n] : c.routed) {
    const auto& [pipeline, device, reason] = key;
    sink.AddCounter("qpool_requests_routed_total",
                    "Requests the router sent to a replica, by its device and the reason (idle, "
                    "onload, least-loaded).",
                    {{"pipeline", pipeline}, {"device", device}, {"reason", reason}},
                    static_cast<double>(n));
  }
  // Note [Counters start at zero]: every loaded pipeline (and each of its replicas' devices) has
  // these series from its load on, at 0 until the first event, so that an alert on their
  // increase sees 0 rather than no data. So do its request families (RequestMetrics::
  // CreateSeries), which this collector creates in the registered families: the registry reads
  // those after running its collectors, so they show in this scrape already.
  const std::vector<PipelineStatus> loaded = registry_.ListLoaded();
  auto evictions = c.evictions;
  auto host_evictions = c.host_evictions;
  auto retries = c.retries;
  for (const auto& p : loaded) {
    std::vector<std::string> devices;
    for (const auto& r : p.replicas) {
      evictions.emplace(std::make_pair(p.name, r.device), 0);
      devices.push_back(r.device);
    }
    host_evictions.emplace(p.name, 0);
    retries.emplace(p.name, 0);
    requests_.CreateSeries(p.name, devices);
  }
  for (const auto& [key, n] : evictions) {
    sink.AddCounter("qpool_evictions_total",
                    "Idle replicas offloaded to host memory to make room under a GPU's budget.",
                    {{"pipeline", key.first}, {"device", key.second}}, static_cast<double>(n));
  }
  for (const auto& [key, n] : c.scale_outs) {
    sink.AddCounter("qpool_replica_scale_outs_total",
                    "Replicas loaded because every replica of the pipeline was busy "
                    "(placement.max_replicas).",
                    {{"pipeline", key.first}, {"device", key.second}}, static_cast<double>(n));
  }
  for (const auto& [pipeline, n] : host_evictions) {
    sink.AddCounter("qpool_host_evictions_total",
                    "Idle pipelines unloaded to make room in host memory for another's load "
                    "(--host-memory-budget).",
                    {{"pipeline", pipeline}}, static_cast<double>(n));
  }
  for (const auto& [pipeline, n] : retries) {
    sink.AddCounter("qpool_request_retries_total",
                    "Requests retried on another device after running out of memory.",
                    {{"pipeline", pipeline}}, static_cast<double>(n));
  }
  for (const auto& p : loaded) {
    for (const auto& replica : p.replicas) {
      for (const auto& f : replica.forwards) {
        const MetricLabels labels = {
            {"pipeline", p.name}, {"component", f.component}, {"device", replica.device}};
        auto with = [&labels](const char* name, const std::string& value) {
          MetricLabels out = labels;
          out.emplace_back(name, value);
          return out;
        };
        const char* help =
            "Forward calls of a loaded replica's component, by the path that ran them: its "
            "compiled forward (an ahead-of-time compiled package) or TorchScript.";
        sink.AddCounter("qpool_component_forwards_total", help, with("path", "compiled"),
                        static_cast<double>(f.compiled));
        sink.AddCounter("qpool_component_forwards_total", help, with("path", "torchscript"),
                        static_cast<double>(f.total - f.compiled));
        if (f.has_compiled) {
          sink.AddGauge("qpool_compiled_forward_info",
                        "A loaded replica's component that has an ahead-of-time compiled "
                        "package, and the attention order it was compiled under; the value is 1.",
                        with("attention", f.compiled_attention), 1.0);
        }
      }
    }
    for (const auto& component : p.components) {
      // component.device is where the component's tensors are: its GPU, or cpu when offloaded.
      auto bytes = [&](const char* kind, uint64_t v) {
        sink.AddGauge("qpool_pipeline_memory_bytes",
                      "Bytes a loaded pipeline's component holds where it is now, by kind "
                      "(weights, quant_state, other, graph).",
                      {{"pipeline", p.name},
                       {"component", component.name},
                       {"device", component.device},
                       {"kind", kind}},
                      static_cast<double>(v));
      };
      bytes("weights", component.bytes.weight);
      bytes("quant_state", component.bytes.quant_state);
      bytes("other", component.bytes.other);
      bytes("graph", component.bytes.graph);
      if (component.host_bytes > 0 && component.device != "cpu") {
        sink.AddGauge("qpool_pipeline_host_copy_bytes",
                      "Bytes of the pinned host copy kept while the component is on its GPU.",
                      {{"pipeline", p.name}, {"component", component.name}},
                      static_cast<double>(component.host_bytes));
      }
    }
  }
}

}  // namespace qpool
