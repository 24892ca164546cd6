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
    for (const auto& [name, device] : registry_.IdleOffloadsDue()) {
      Status submitted =
          devices_.worker(device).Submit([this, name = name, device = device](bool run) {
            if (!run) return;
            auto report =
                registry_.ChangeResidency(name, device, ResidencyChange::kOffload, device);
            if (report.ok()) {
              log::Info("pipeline '", name, "' offloaded from ", device.str(),
                        " after its idle time (", report->bytes, " bytes copied)");
            } else if (report.status().code() != StatusCode::kNotFound &&
                       report.status().code() != StatusCode::kFailedPrecondition) {
              log::Warn("idle offload of '", name, "' failed: ", report.status().message());
            }
          });
      (void)submitted;  // a full queue means the pipeline is not idle for long; next period
    }
    lock.lock();
  }
}

}  // namespace qpool
