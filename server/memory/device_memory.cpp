#include "memory/device_memory.h"

#include <ATen/Context.h>
#if QPOOL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace qpool {

DeviceMemoryStats DeviceMemory::Read(const c10::Device& device) const {
  DeviceMemoryStats stats;
  stats.device = device.str();
  if (device.is_cpu()) {
    stats.allocated_bytes = stats.reserved_bytes = stats.active_bytes = arenas_.cpu_bytes();
    stats.requested_bytes = stats.allocated_bytes;
    return stats;
  }
  if (!device.is_cuda()) return stats;
#if QPOOL_WITH_CUDA
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  auto u = [](int64_t v) { return static_cast<uint64_t>(v < 0 ? 0 : v); };
  stats.allocated_bytes = u(s.allocated_bytes[agg].current);
  stats.reserved_bytes = u(s.reserved_bytes[agg].current);
  stats.active_bytes = u(s.active_bytes[agg].current);
  stats.inactive_split_bytes = u(s.inactive_split_bytes[agg].current);
  stats.requested_bytes = u(s.requested_bytes[agg].current);
  stats.peak_allocated_bytes = u(s.allocated_bytes[agg].peak);
  stats.alloc_retries = u(s.num_alloc_retries);
  stats.ooms = u(s.num_ooms);
  c10::cuda::CUDAGuard guard(device);
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    stats.free_bytes = free;
    stats.total_bytes = total;
  } else {
    (void)cudaGetLastError();  // leave zeros; the next call may succeed
  }
#endif
  return stats;
}

std::vector<DeviceMemoryStats> DeviceMemory::ReadAll(
    const std::vector<c10::Device>& devices) const {
  std::vector<DeviceMemoryStats> out;
  out.reserve(devices.size());
  for (const auto& device : devices) out.push_back(Read(device));
  return out;
}

void DeviceMemory::ResetPeak(const c10::Device& device) const {
#if QPOOL_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

void DeviceMemory::EmptyCache() const {
#if QPOOL_WITH_CUDA
  if (at::globalContext().hasCUDA()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

}  // namespace qpool
