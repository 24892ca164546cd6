#include "api/agent_weight.h"

#include <algorithm>
#include <cmath>

namespace qpool::api {
namespace {

double Clamp01(double x) { return std::min(1.0, std::max(0.0, x)); }

}  // namespace

int AgentWeightPercent(const PoolLoad& load) {
  const double devices = static_cast<double>(std::max<size_t>(1, load.serving_devices));
  const double busy = static_cast<double>(
      std::max(static_cast<size_t>(std::max(0, load.in_flight)), load.device_tasks));
  const double backlog = 1.0 / (1.0 + busy / devices);
  const double admission =
      load.queue_capacity > 0
          ? 1.0 - Clamp01(static_cast<double>(load.in_flight) / load.queue_capacity)
          : 1.0;
  const double memory = load.budget_bytes > 0
                            ? 0.5 + 0.5 * Clamp01(1.0 - static_cast<double>(load.allocated_bytes) /
                                                            static_cast<double>(load.budget_bytes))
                            : 1.0;
  const double residency = load.loaded_pipelines > 0
                               ? 0.5 + 0.5 * Clamp01(static_cast<double>(load.resident_pipelines) /
                                                     load.loaded_pipelines)
                               : 0.0;
  const long weight = std::lround(100.0 * backlog * admission * memory * residency);
  return static_cast<int>(std::min(100L, std::max(1L, weight)));
}

std::string AgentAnswer(const PoolLoad& load, bool serving) {
  if (!serving || load.draining) return "drain\n";
  return "up ready " + std::to_string(AgentWeightPercent(load)) + "%\n";
}

}  // namespace qpool::api
