// DevicePool: the devices qpool serves on (the CPU and each visible GPU), one worker each.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pool/device_worker.h"
#include "util/status.h"

namespace qpool {

struct DevicePoolOptions {
  // Where pipelines go unless told otherwise: "auto" = every visible GPU, else the CPU; "cpu";
  // "cuda" = every GPU; "cuda:N"; or a list "cuda:0,cuda:1".
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

  // The devices a placement allows: "auto"/"" (the defaults), "cpu", "cuda" (every GPU),
  // "cuda:N" or a list "cuda:N,cuda:M". InvalidArgument for malformed or missing devices.
  StatusOr<std::vector<c10::Device>> Candidates(const std::string& request) const;
  // One device of Candidates(request).
  // `loaded_bytes(device)` ranks GPUs when several qualify: the least loaded wins.
  StatusOr<c10::Device> Resolve(const std::string& request,
                                const std::function<uint64_t(const c10::Device&)>& loaded_bytes) const;
  // The worker of `device` (which Resolve returned).
  DeviceWorker& worker(const c10::Device& device);
  // Every device served, CPU first.
  std::vector<c10::Device> devices() const;
  // Runs `step(d)` for each device d of `devices` in turn, each on d's worker (the next is queued
  // when one returns OK), then `done` with the first error, or OK after the last (at once for
  // none). `done` runs on a worker thread, or on the caller's when a step cannot be queued;
  // Unavailable when the pool stops first.
  using Step = std::function<Status(const c10::Device&)>;
  void RunInTurn(std::vector<c10::Device> devices, Step step,
                 std::function<void(const Status&)> done);
  // Stops every worker (queued requests get UNAVAILABLE).
  void Stop();

 private:
  DevicePool() = default;
  std::vector<c10::Device> defaults_;  // candidates for "auto"
  std::vector<std::unique_ptr<DeviceWorker>> workers_;
};

}  // namespace qpool
