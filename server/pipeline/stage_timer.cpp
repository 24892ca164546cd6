#include "pipeline/stage_timer.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace qpool {

StageTimer::StageTimer(c10::Device device) : device_(device) {}

size_t StageTimer::Mark() {
  if (device_.is_cpu()) {
    now_.push_back(std::chrono::steady_clock::now());
    return now_.size() - 1;
  }
  events_.emplace_back(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device_.type());
  events_.back().record(impl->getStream(device_));
  return events_.size() - 1;
}

double StageTimer::Seconds(size_t from, size_t to) const {
  if (device_.is_cpu()) return std::chrono::duration<double>(now_.at(to) - now_.at(from)).count();
  events_.at(to).synchronize();
  return events_.at(from).elapsedTime(events_.at(to)) / 1000.0;
}

}  // namespace qpool
