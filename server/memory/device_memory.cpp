#include "memory/device_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

namespace qpool {

std::vector<DeviceMemoryStats> ReadDeviceMemory(const std::vector<c10::Device>& devices) {
  std::vector<DeviceMemoryStats> out;
  for (const auto& device : devices) {
    DeviceMemoryStats stats;
    stats.device = device.str();
    if (device.is_cuda()) {
      const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      stats.allocated_bytes = static_cast<uint64_t>(s.allocated_bytes[agg].current);
      stats.reserved_bytes = static_cast<uint64_t>(s.reserved_bytes[agg].current);
      c10::cuda::CUDAGuard guard(device);
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        stats.free_bytes = free;
        stats.total_bytes = total;
      } else {
        (void)cudaGetLastError();  // leave zeros; the next call may succeed
      }
    }
    out.push_back(std::move(stats));
  }
  return out;
}

}  // namespace qpool
