#include "memory/leak_check.h"

#include <utility>

namespace qpool {

LeakCheck::LeakCheck(const DeviceMemory* memory, std::vector<HeldBlock> blocks,
                     const c10::Device& home)
    : memory_(memory), blocks_(std::move(blocks)) {
  for (const auto& b : blocks_) {
    if (b.device.is_cuda()) expected_[b.device.str()] += b.allocator_bytes;
  }
  devices_.emplace_back(c10::kCPU);
  for (const auto& [d, bytes] : expected_) devices_.emplace_back(d);
  if (!home.is_cpu() && !expected_.count(home.str())) devices_.push_back(home);
  if (memory_ == nullptr) return;
  for (const auto& d : devices_) before_[d.str()] = memory_->Read(d);
}

DeviceMemoryStats LeakCheck::before(const c10::Device& device) const {
  auto it = before_.find(device.str());
  return it == before_.end() ? DeviceMemoryStats{} : it->second;
}

LeakReport LeakCheck::Finish() const {
  LeakReport report;
  for (const auto& b : blocks_) {
    if (!b.storage.expired()) report.retained_bytes += b.bytes;
  }
  if (memory_ == nullptr) return report;
  for (const auto& [d, bytes] : expected_) {
    const DeviceMemoryStats after = memory_->Read(c10::Device(d));
    const uint64_t was = before_.at(d).allocated_bytes;
    const uint64_t drop = was > after.allocated_bytes ? was - after.allocated_bytes : 0;
    if (drop < bytes) report.shortfall_bytes += bytes - drop;
  }
  return report;
}

}  // namespace qpool
