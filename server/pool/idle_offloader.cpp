#include "pool/idle_offloader.h"

#include "util/log.h"

namespace qpool {

IdleOffloader::IdleOffloader(PipelineRegistry& registry, DevicePool& devices,
                             std::chrono::milliseconds period)
    : registry_(registry), devices_(devices), period_(period), thread_([this] { Run(); }) {}

IdleOffloader::~IdleOffloader() { Stop(); }

void IdleOffloader::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void IdleOffloader::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, period_, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    for (const auto& name : registry_.IdleOffloadsDue()) {
      auto device = registry_.ChangeTarget(name, PipelineRegistry::Change::kOffload, "");
      if (!device.ok()) continue;  // unloaded meanwhile
      Status submitted = devices_.worker(*device).Submit([this, name](bool run) {
        if (!run) return;
        auto result = registry_.ChangeResidency(name, PipelineRegistry::Change::kOffload, "");
        if (result.ok()) {
          log::Info("pipeline '", name, "' offloaded after its idle time (", result->second.bytes,
                    " bytes copied)");
        } else if (result.status().code() != StatusCode::kNotFound) {
          log::Warn("idle offload of '", name, "' failed: ", result.status().message());
        }
      });
      (void)submitted;  // a full queue means the pipeline is not idle for long; next period
    }
    lock.lock();
  }
}

}  // namespace qpool
