#include "memory/device_memory.h"

#include <ATen/Context.h>
#if QPOOL_WITH_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <shared_mutex>
#endif

namespace qpool {

#if QPOOL_WITH_CUDA
namespace {

// Where `device`'s cuBLAS and cuBLASLt workspaces start. PyTorch keeps one per (handle, stream)
// in maps it guards with a shared mutex, and allocates them from the caching allocator.
std::set<size_t> WorkspaceAddresses(c10::DeviceIndex device) {
  std::set<size_t> out;
  for (auto* workspaces : {&at::cuda::cublas_handle_stream_to_workspace(),
                           &at::cuda::cublaslt_handle_stream_to_workspace()}) {
    std::shared_lock<std::shared_mutex> lock(workspaces->mutex);
    for (const auto& [key, data] : workspaces->map) {
      if (data.get() != nullptr && data.device().index() == device) {
        out.insert(reinterpret_cast<size_t>(data.get()));
      }
    }
  }
  return out;
}

}  // namespace
#endif

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

AllocatorParts DeviceMemory::ReadParts(const c10::Device& device) const {
  AllocatorParts parts;
#if QPOOL_WITH_CUDA
  if (!device.is_cuda()) return parts;
  const std::set<size_t> workspaces = WorkspaceAddresses(device.index());
  const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, false);
  for (const auto& segment : snapshot.segments) {
    if (segment.device != device.index()) continue;
    const bool graph_pool = segment.owner_private_pool_id != c10::MempoolId_t{0, 0};
    if (graph_pool) parts.graph_pool_reserved_bytes += segment.total_size;
    // A segment's blocks are listed in address order and tile it.
    size_t address = segment.address;
    for (const auto& block : segment.blocks) {
      if (block.allocated) {
        if (workspaces.count(address)) {
          parts.workspace_bytes += block.size;
        } else if (graph_pool) {
          parts.graph_pool_allocated_bytes += block.size;
        }
      }
      address += block.size;
    }
  }
#else
  (void)device;
#endif
  return parts;
}

std::optional<DriverView> DeviceMemory::ReadDriver(const c10::Device& device) const {
  if (driver_ == nullptr || !device.is_cuda()) return std::nullopt;
  auto bus = bus_ids_.find(device.index());
  if (bus == bus_ids_.end()) return std::nullopt;
  std::optional<DriverReading> reading = driver_->Read(bus->second);
  if (!reading) return std::nullopt;
  DriverView view;
  view.reading = *reading;
  auto context = context_bytes_.find(device.index());
  if (context != context_bytes_.end()) view.context_bytes = context->second;
  return view;
}

void DeviceMemory::MeasureContexts(const std::vector<c10::Device>& devices) {
#if QPOOL_WITH_CUDA
  if (driver_ == nullptr || !driver_->available()) return;
  for (const auto& device : devices) {
    if (!device.is_cuda()) continue;
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device.index()) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    bus_ids_[device.index()] = bus_id;
    c10::cuda::CUDAGuard guard(device);
    (void)cudaDeviceSynchronize();
    const uint64_t reserved = Read(device).reserved_bytes;
    std::optional<DriverReading> reading = driver_->Read(bus_id);
    if (reading && reading->process_bytes && *reading->process_bytes >= reserved) {
      context_bytes_[device.index()] = *reading->process_bytes - reserved;
    }
  }
#else
  (void)devices;
#endif
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
