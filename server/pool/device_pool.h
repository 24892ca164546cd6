// DevicePool: the devices qpool serves on (the CPU and each visible GPU), one worker each.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "pool/device_worker.h"
#include "util/status.h"

namespace qpool {

struct DevicePoolOptions {
  // "auto" = every visible GPU, else the CPU; "cpu"; "cuda" = every GPU; "cuda:N".
  std::string default_device = "auto";
  // Requests waiting per device before RESOURCE_EXHAUSTED.
  size_t max_queue = 64;
};

// Thread safety: immutable after construction except the workers, which are thread-safe.
class DevicePool {
 public:
  // Finds the devices, initializes each GPU's allocator (its statistics throw until the first
  // allocation) and starts the workers. InvalidArgument when default_device names a missing GPU.
  static StatusOr<std::unique_ptr<DevicePool>> Create(const DevicePoolOptions& options);
  ~DevicePool();

  // Parses and checks "cpu", "cuda", "cuda:N" or "auto"/"" (the default placement).
  // `loaded_bytes(device)` ranks GPUs when several qualify: the least loaded wins.
  StatusOr<c10::Device> Resolve(const std::string& request,
                                const std::function<uint64_t(const c10::Device&)>& loaded_bytes) const;
  // The worker of `device` (which Resolve returned).
  DeviceWorker& worker(const c10::Device& device);
  // Every device served, CPU first.
  std::vector<c10::Device> devices() const;
  // Stops every worker (queued requests get UNAVAILABLE).
  void Stop();

 private:
  DevicePool() = default;
  std::vector<c10::Device> defaults_;  // candidates for "auto"
  std::vector<std::unique_ptr<DeviceWorker>> workers_;
};

}  // namespace qpool
