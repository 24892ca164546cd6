// Reads how much memory each device's caching allocator and driver report.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qpool {

struct DeviceMemoryStats {
  std::string device;
  uint64_t allocated_bytes = 0;  // caching allocator: in use by tensors
  uint64_t reserved_bytes = 0;   // caching allocator: held from the driver
  uint64_t total_bytes = 0;      // device capacity (0 for the CPU)
  uint64_t free_bytes = 0;       // driver's free memory (0 for the CPU)
};

// One entry per device; the CPU reports zeros (host memory is accounted per pipeline).
// GPUs must have had a first allocation (DevicePool::Create does it).
std::vector<DeviceMemoryStats> ReadDeviceMemory(const std::vector<c10::Device>& devices);

}  // namespace qpool
